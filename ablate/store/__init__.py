"""Store: what lands on disk. Atomic writes (atomic), the one file lock (lock), a run folder (rundir),
a sweep folder (sweep), the tidy tables collected from run folders (tables).

May import: config.
"""
