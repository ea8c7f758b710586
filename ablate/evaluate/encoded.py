"""One example as a model reads it (Encoded), the label of the positions that carry no loss (IGNORE), and the
padding of ragged rows into one tensor (pad_rows).

May import: nothing of ablate. Torch only.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

IGNORE = -100  # label of sub-tokens that carry no loss (special tokens, non-first pieces of a word, padding)


class Encoded(NamedTuple):
    input_ids: list[int]
    token_type_ids: list[int] | None
    label: Any  # token cls: list of ids (IGNORE for unlabelled pieces); else id/vector/float
    word_ids: list[int | None] | None
    offsets: list[tuple[int, int]] | None = None  # span tasks: each sub-token's characters ((0, 0): special)


def pad_rows(rows, value, n: int | None = None, dtype=torch.long) -> torch.Tensor:
    """Rows of unequal lengths as one (rows, n) tensor, padded with `value` (n: the longest row)."""
    n = max(len(r) for r in rows) if n is None else n
    return torch.tensor([list(r) + [value] * (n - len(r)) for r in rows], dtype=dtype)
