"""Launch: runs as jobs. The one scheduler for sweeps and tunes over submitit executors (local, debug,
Slurm: arrays, requeue), the worker that executes one run folder end to end (worker).

May import: every stage below it (config ... evaluate).
"""
