"""Plan: from validated files to concrete work. Grid expansion into RunSpecs (grid), freeze words to
layer sets (freezing), each phase resolved against the model once: steps and frozen layers (phases), the
cost of a sweep from its steps and a throughput (cost), a grid's layer transplants against its runs
(transplants).

May import: config, store, models.
"""
