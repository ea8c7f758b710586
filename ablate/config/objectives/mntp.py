"""Masked next-token prediction (LLM2Vec): tokens masked as in MLM, each predicted at the position before it
(i - 1), under bidirectional attention. A token whose previous position is in another document, or that
opens its row, is never masked (nothing would predict it)."""

from __future__ import annotations

import torch

from ablate.config.objectives.base import (BIDIRECTIONAL, IGNORE, Objective, corrupt, mask_rate_at, maskable)


class MaskedNextToken(Objective):
    name = "mntp"
    pattern = BIDIRECTIONAL
    random_draws = ("MNTP masking",)
    fields = ("mask_rate", "mask_rate_end", "corruption")
    summary = "masked tokens predicted at the position before them (LLM2Vec); bidirectional"

    def make(self, ids, docs, draws, tokens, params):
        rate = mask_rate_at(params, draws.step, draws.steps)
        candidates = maskable(ids, tokens)
        candidates[:, 0] = False
        candidates[:, 1:] &= docs[:, 1:] == docs[:, :-1]
        masked = candidates & (torch.rand(ids.shape, generator=draws.masking) < rate)
        labels = torch.full_like(ids, IGNORE)
        labels[:, :-1] = torch.where(masked[:, 1:], ids[:, 1:], torch.full_like(ids[:, 1:], IGNORE))
        return corrupt(ids, masked, params.corruption, tokens, draws.masking), labels, None


ENTRY = MaskedNextToken()
