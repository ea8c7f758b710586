"""Masked language modelling: a fraction of the non-special tokens masked (by the corruption rule, default
80/10/10), loss at the masked positions; bidirectional attention."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from ablate.config.objectives.base import Draws, MaskingObjective, TokenInfo


def mlm_inputs(
    input_ids: torch.Tensor,
    mask_rate: float,
    special_ids: torch.Tensor,
    mask_id: int,
    vocab_size: int,
    generator: torch.Generator,
    split: tuple[float, float, float] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(masked inputs, labels); special tokens are never masked."""
    fixed = SimpleNamespace(mask_rate=mask_rate, mask_rate_end=None, corruption=split)
    draws = Draws(generator, generator, 0, 1, len(input_ids))
    inputs, labels, _ = ENTRY.make(input_ids, input_ids, draws, TokenInfo(special_ids, mask_id, vocab_size), fixed)
    return inputs, labels


class MaskedLM(MaskingObjective):
    name = "mlm"
    random_draws = ("MLM masking",)
    summary = "masked tokens predicted in place; bidirectional"


ENTRY = MaskedLM()
