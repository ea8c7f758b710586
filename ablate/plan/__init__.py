"""Plan: from validated files to concrete work. Grid expansion into RunSpecs (grid), freeze words to
layer sets (freezing), each phase resolved against the model once: steps and frozen layers (phases), a
grid's layer transplants against its runs (transplants).

May import: config, store, models.
"""
