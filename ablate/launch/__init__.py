"""Running runs: the worker (one run folder, start to finish), the executors (how a run becomes a submitit
job), the scheduler (run folders -> jobs -> which have ended; a sweep's submission and status), the
preparation of a sweep's corpora before its runs, a grid's checks before anything runs, the cost plan's
inputs: the throughput measured here (calibrate) and what runs need and took (estimates), and a sweep's
layer transplants waiting for their runs (transplants). What a run will need in memory is predicted below it
(ablate.predict).

May import: config, store, data, models, plan, analysis, train, evaluate, predict.
"""
