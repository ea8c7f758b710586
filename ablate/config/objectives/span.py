"""Span masking (T5, UL2, SpanBERT as an encoder objective): spans of geometric length with mean
`span_length` (default 3) start at a rate of mask_rate / span_length per token, so about mask_rate of the
tokens are masked (overlapping spans cover fewer); each masked token is corrupted by the corruption rule and
predicted in place; bidirectional attention. Special tokens are never masked."""

from __future__ import annotations

import math

import torch

from ablate.config.objectives.base import MaskingObjective

DEFAULT_SPAN_LENGTH = 3.0


def span_mask(
    ids: torch.Tensor, candidates: torch.Tensor, rate: float, mean: float, generator: torch.Generator
) -> torch.Tensor:
    """(B, L) bool: the positions covered by spans, among `candidates`."""
    starts = candidates & (torch.rand(ids.shape, generator=generator) < rate / mean)
    u = torch.rand(ids.shape, generator=generator).clamp_min(1e-12)
    if mean > 1:  # geometric on 1, 2, ... with mean `mean`: P(length > k) = (1 - 1/mean)^k
        lengths = 1 + torch.floor(torch.log(u) / math.log(1 - 1 / mean)).long()
    else:
        lengths = torch.ones_like(ids)
    positions = torch.arange(ids.shape[1]).expand_as(ids)
    ends = torch.where(starts, positions + lengths - 1, torch.full_like(ids, -1))
    reach = torch.cummax(ends, dim=1).values  # the furthest end of a span started at or before t
    return candidates & (reach >= positions)


class SpanMasking(MaskingObjective):
    name = "span"
    random_draws = ("span masking",)
    fields = ("mask_rate", "mask_rate_end", "corruption", "span_length")
    summary = "spans of mean span_length masked, predicted in place; bidirectional"

    def effective(self, params, name):
        if name == "span_length":
            return DEFAULT_SPAN_LENGTH if params.span_length is None else params.span_length
        return super().effective(params, name)

    def choose(self, ids, candidates, rate, draws, params):
        return span_mask(ids, candidates, rate, self.effective(params, "span_length"), draws.masking)


ENTRY = SpanMasking()
