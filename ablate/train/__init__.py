"""Train: one run of continued pretraining. Objectives and causal masks (objectives), LR schedules
(schedule), AdamW with moments kept by name (optimizer), the fused vocabulary projection + cross-entropy
(vocab_loss), bf16 autocast, torch.compile and deterministic algorithms (precision), checkpoints (checkpoint), the process group (distributed), the loop itself (loop) and one
rank of a data-parallel run (ranks).

May import: config, store, data, models, plan, analysis.
"""
