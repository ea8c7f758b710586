"""Prefix language modelling (UL2's S-denoiser, T5's prefix-LM): each row is split at a point drawn uniformly
in [1, L - 1]; the prefix attends bidirectionally within itself, the suffix causally (to the whole prefix and
the suffix before it); the loss is next-token prediction of the suffix tokens (none across a document
boundary)."""

from __future__ import annotations

import torch

from ablate.config.objectives.base import IGNORE, PREFIX, Objective
from ablate.config.objectives.clm import clm_labels


def prefix_labels(ids: torch.Tensor, docs: torch.Tensor, prefix: torch.Tensor) -> torch.Tensor:
    """Next-token labels at positions t >= prefix - 1 (those predicting a suffix token), else IGNORE."""
    labels = clm_labels(ids, docs)
    positions = torch.arange(ids.shape[1])[None]
    return torch.where(positions >= prefix[:, None] - 1, labels, torch.full_like(labels, IGNORE))


class PrefixLM(Objective):
    name = "prefix-lm"
    pattern = PREFIX
    random_draws = ("prefix split",)
    summary = "a bidirectional prefix, the suffix predicted token by token (causal)"

    def make(self, ids, docs, draws, tokens, params):
        prefix = torch.randint(1, ids.shape[1], (len(ids),), generator=draws.masking)
        return ids, prefix_labels(ids, docs, prefix), prefix


ENTRY = PrefixLM()
