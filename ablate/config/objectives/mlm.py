"""Masked language modelling: a fraction of the non-special tokens masked (by the corruption rule, default
80/10/10), loss at the masked positions; bidirectional attention."""

from __future__ import annotations

import torch

from ablate.config.objectives.base import (BIDIRECTIONAL, IGNORE, Objective, TokenInfo, corrupt, mask_rate_at,
                                           maskable)


def mlm_inputs(input_ids: torch.Tensor, mask_rate: float, special_ids: torch.Tensor, mask_id: int,
               vocab_size: int, generator: torch.Generator,
               split: tuple[float, float, float] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(masked inputs, labels); special tokens are never masked."""
    tokens = TokenInfo(special_ids, mask_id, vocab_size)
    masked = maskable(input_ids, tokens) & (torch.rand(input_ids.shape, generator=generator) < mask_rate)
    labels = torch.where(masked, input_ids, torch.full_like(input_ids, IGNORE))
    return corrupt(input_ids, masked, split, tokens, generator), labels


class MaskedLM(Objective):
    name = "mlm"
    pattern = BIDIRECTIONAL
    random_draws = ("MLM masking",)
    fields = ("mask_rate", "mask_rate_end", "corruption")
    summary = "masked tokens predicted in place; bidirectional"

    def make(self, ids, docs, draws, tokens, params):
        rate = mask_rate_at(params, draws.step, draws.steps)
        inputs, labels = mlm_inputs(ids, rate, tokens.special_ids, tokens.mask_id, tokens.vocab_size, draws.masking,
                                    params.corruption)
        return inputs, labels, None


ENTRY = MaskedLM()
