"""Data: corpora -> token streams packed into fixed-length sequences, ordered by the data seed alone.

May import: config, store.
"""
