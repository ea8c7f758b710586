"""Evaluate: downstream tasks. Declarative task files and their readers (tasks), metrics (metrics),
fine-tuning (finetune) and the evaluation of run folders and base models (runs).

May import: config, store, data, models, plan, analysis, train.
"""
