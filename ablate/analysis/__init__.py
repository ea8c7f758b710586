"""Analysis: per-layer measures of how continued pretraining moved an encoder (CKA, weight change,
gradient norms) and the cross-run CKA ratio.

May import: config, store, data, models, plan.
"""
