"""Evaluate: downstream tasks. Declarative task files and their readers (tasks), fine-tuning protocol profiles
(protocol), metrics (metrics), pooling of sequence classifiers (pooling), fine-tuning (finetune) and its
batches (batching), what a score was computed from (identity), the resumable task x seed loop over score files
(scores), the evaluation of run folders and base models (runs), and what the statistics may pair on (units,
bootstrap).

May import: config, store, data, models, plan, analysis, train.
"""
