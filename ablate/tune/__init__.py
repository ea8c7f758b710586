"""Optuna studies over RunSpecs: a tune is a sweep whose runs are proposed by a sampler and may be pruned.

schema (the tune file's keys and search space), sampling (sampler, pruner), trials (trial <-> run, the
objective value, tune.json), spec (load_tune: a file read and checked), storage (where a study lives),
pruning (in the run's own job: report each logged loss, end the run `pruned` when the pruner says so),
runner (ask/tell on the launcher's one Scheduler), dashboard, figure. No command-line code here.

May import: config, store, data, models, plan, analysis, train, evaluate, launch.
"""
