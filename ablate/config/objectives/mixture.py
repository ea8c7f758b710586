"""A weighted mixture of objectives within one phase (GPT-BERT trains a masked and a causal objective in
every batch): `mixture:` members (each an objective with its own fields and a weight) and a `granularity`:
each optimizer step, each micro-batch or each sequence trains one member, drawn with the weights from a
stream seeded by (seed, step), apart from the masking draws (so the members' batches are as they would be).
Rows of different patterns in one micro-batch (granularity sequence) attend by per-row prefix lengths."""

from __future__ import annotations

import torch

from ablate.config.objectives.base import Batch, Objective
from ablate.config.base import Located
from ablate.config.objectives.registry import get, names

GRANULARITIES = ("step", "micro-batch", "sequence")


def member_labels(params) -> tuple[str, ...]:
    """Each member's name in the curves: its objective, numbered when two members share one."""
    names = [m.objective for m in params.mixture]
    return tuple(n if names.count(n) == 1 else f"{n}{i}" for i, n in enumerate(names))


def choose_members(
    n_rows: int, weights: list[float], granularity: str, micro: int, choice: torch.Generator
) -> torch.Tensor:
    """(n_rows,) member index per row: one draw for the step, per micro-batch or per row."""
    w = torch.tensor(weights, dtype=torch.float64)
    draws = {"step": 1, "micro-batch": -(-n_rows // micro), "sequence": n_rows}[granularity]
    picked = torch.multinomial(w, draws, replacement=True, generator=choice)
    if granularity == "step":
        return picked.expand(n_rows).clone()
    if granularity == "micro-batch":
        return picked.repeat_interleave(micro)[:n_rows]
    return picked


class Mixture(Objective):
    name = "mixture"
    pattern = "mixed"  # per row: its member's
    random_draws = ("mixture member draw",)
    fields = ("mixture", "granularity")
    summary = "weighted members within a phase, by step, micro-batch or sequence"

    def check(self, params) -> None:
        if not hasattr(params, "mixture"):  # a member of a mixture (it has no members of its own)
            raise Located(
                "a mixture member cannot itself be a mixture",
                "objective",
                self.name,
                ", ".join(n for n in names() if n != self.name),
            )
        super().check(params)
        if not params.mixture:
            raise ValueError(
                "objective mixture needs `mixture:` members; allowed: [{objective, weight, its fields}, ...]"
            )
        for member in params.mixture:
            if member.objective == self.name:
                raise ValueError(
                    "a mixture member cannot itself be a mixture; allowed: "
                    + ", ".join(n for n in names() if n != self.name)
                )

    def identity(self, params):
        return {
            "objective": self.name,
            "granularity": params.granularity or "step",
            "members": [{**get(m.objective).identity(m), "weight": m.weight} for m in params.mixture],
        }

    def members(self, params):
        return [(get(m.objective), m, m.weight) for m in params.mixture]

    def batch(self, ids, docs, draws, tokens, params) -> Batch:
        labels_of = member_labels(params)
        member = choose_members(
            len(ids), [m.weight for m in params.mixture], params.granularity or "step", draws.micro, draws.choice
        )
        inputs, labels = ids.clone(), torch.full_like(ids, -100)
        prefix = torch.zeros(len(ids), dtype=torch.long)
        rates: dict[str, float] = {}
        for index, (entry, member_params, _) in enumerate(self.members(params)):
            rows = member == index
            if not bool(rows.any()):
                continue
            part = entry.batch(ids[rows], docs[rows], draws, tokens, member_params)
            inputs[rows], labels[rows], prefix[rows] = part.inputs, part.labels, part.prefix
            rates.update({labels_of[index]: rate for rate in part.mask_rates.values()})
        return Batch(inputs, labels, prefix, member, labels_of, rates)


ENTRY = Mixture()
