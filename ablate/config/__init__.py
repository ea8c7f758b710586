"""Config: what a user writes, validated. The strict base model, the YAML 1.2 loader and the one
pydantic-error translator (base); the run spec, the one currency between stages (spec); grid files (grid);
layer transplants as written (transplants); where data, caches and results live (paths); the bad-input
error (errors).

May import: nothing of ablate. It is the lowest floor.
"""
