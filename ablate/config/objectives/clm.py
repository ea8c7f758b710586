"""Causal language modelling: next-token labels (labels[t] = input[t+1]), none across a document boundary or
at the last position; causal attention."""

from __future__ import annotations

import torch

from ablate.config.objectives.base import CAUSAL, IGNORE, Objective


def clm_labels(input_ids: torch.Tensor, doc_ids: torch.Tensor) -> torch.Tensor:
    """labels[t] = input_ids[t+1] when t and t+1 belong to the same document, else -100."""
    labels = torch.full_like(input_ids, IGNORE)
    same_doc = doc_ids[:, 1:] == doc_ids[:, :-1]
    labels[:, :-1] = torch.where(same_doc, input_ids[:, 1:], torch.full_like(input_ids[:, 1:], IGNORE))
    return labels


class CausalLM(Objective):
    name = "clm"
    pattern = CAUSAL
    summary = "the next token from the ones before; causal"

    def make(self, ids, docs, draws, tokens, params):
        return ids, clm_labels(ids, docs), None


ENTRY = CausalLM()
