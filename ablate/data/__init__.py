"""Data: corpora streamed from their files, tokenized once into memory-mapped token shards (prepared folders),
packed into fixed-length sequences, ordered by the data seed alone; and the data root's datasets: where each
comes from and what its files must be (catalog), fetched from their public sources (download, converters,
fetch: `ablate data fetch`).

May import: config, store.
"""
