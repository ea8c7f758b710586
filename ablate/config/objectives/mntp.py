"""Masked next-token prediction (LLM2Vec): tokens masked as in MLM, each predicted at the position before it
(i - 1), under bidirectional attention. A token whose previous position is in another document, or that
opens its row, is never masked (nothing would predict it)."""

from __future__ import annotations

import torch

from ablate.config.objectives.base import IGNORE, MaskingObjective, maskable


class MaskedNextToken(MaskingObjective):
    name = "mntp"
    random_draws = ("MNTP masking",)
    summary = "masked tokens predicted at the position before them (LLM2Vec); bidirectional"

    def candidates(self, ids, docs, tokens):
        candidates = maskable(ids, tokens)
        candidates[:, 0] = False
        candidates[:, 1:] &= docs[:, 1:] == docs[:, :-1]
        return candidates

    def targets(self, ids, masked):
        labels = torch.full_like(ids, IGNORE)
        labels[:, :-1] = torch.where(masked[:, 1:], ids[:, 1:], torch.full_like(ids[:, 1:], IGNORE))
        return labels


ENTRY = MaskedNextToken()
