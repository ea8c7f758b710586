"""Data: corpora streamed from their files, tokenized once into memory-mapped token shards (prepared folders),
packed into fixed-length sequences, ordered by the data seed alone.

May import: config, store.
"""
