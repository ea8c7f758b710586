"""Predict: what a run will cost before it runs, on a CPU-only machine. The GPU memory of a training step, traced
on the meta device through the kernels CUDA runs (gpu_memory, cached on disk by trace_cache), of each fine-tuning
task's step (finetune_memory), and the FLOP-based estimate of a fine-tuning's time where none was measured
(finetune_estimate). The launcher's checks ask these before anything is submitted; the worker names an
out-of-memory with them.

May import: config, store, data, models, plan, analysis, train, evaluate.
"""
