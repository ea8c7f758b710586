"""A training step's batch from its phase's objective entry, and what the curves record of it beside the loss.

Every draw is seeded from (seed, global step): the masking stream is the one the loop always drew (so runs
from before objective entries give the numbers they gave), a mixture's member draws come from a stream of
their own, and a masking-rate schedule reads the step within the phase. A resumed run builds the batches the
uninterrupted one built.

May import: config, plan.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from ablate.config import objectives
from ablate.config.objectives.base import Batch, Draws, TokenInfo
from ablate.plan.phases import PhasePlan


def seed_for(*parts: int) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little") & (2**63 - 1)


def objective_batch(ctx, phase: PhasePlan, batch: np.ndarray, docs: np.ndarray, global_step: int) -> Batch:
    """The phase's objective entry on the global batch: every draw from (seed, global step), the masking
    stream as it always was, a mixture's member draws from a stream of their own."""
    spec = ctx.spec
    draws = Draws(
        masking=torch.Generator().manual_seed(seed_for(spec.seed, global_step, 2)),
        choice=torch.Generator().manual_seed(seed_for(spec.seed, global_step, 4)),
        step=global_step - phase.first_step,
        steps=phase.steps,
        micro=spec.micro_batch_size or spec.batch_size,
    )
    tokens = TokenInfo(ctx.special_ids, ctx.mask_id, ctx.vocab_size)
    ids, doc_ids = torch.from_numpy(batch.astype(np.int64)), torch.from_numpy(docs.astype(np.int64))
    return objectives.get(phase.spec.objective).batch(ids, doc_ids, draws, tokens, phase.spec)


def batch_loss(
    head_loss,
    decoder,
    features: torch.Tensor,
    targets: torch.Tensor,
    members: torch.Tensor | None,
    sums: torch.Tensor,
) -> torch.Tensor:
    """The summed loss of a micro-batch's labelled positions. In a mixture (`members`: each labelled
    position's member, on the host) each member's part is added to `sums` too (on the device, unread: the
    curves' loss/<member>, ablate.train.readback)."""
    if members is None:
        return head_loss(features, *decoder, targets)
    total = features.new_zeros(())
    for index in members.unique().tolist():  # a host tensor: nothing waits for the device
        mine = torch.nonzero(members == index).flatten().to(features.device, non_blocking=True)
        part = head_loss(features[mine], *decoder, targets[mine])
        sums[index] += part.detach().double()
        total = total + part
    return total


def step_notes(made: Batch, member_sums: torch.Tensor, mixed: bool) -> dict:
    """The curves' extra columns of a step: mask_rate (one masking objective) or mask_rate/<member>, and
    loss/<member> (a mixture: each member's mean loss over its labelled positions, a device tensor read back
    with the step's loss; NaN when it drew no row)."""
    out: dict = {}
    if not mixed:
        out.update({"mask_rate": rate for rate in made.mask_rates.values()})
        return out
    out.update({f"mask_rate/{label}": rate for label, rate in made.mask_rates.items()})
    for index, label in enumerate(made.labels_of):
        n = int(((made.labels != -100) & (made.member[:, None] == index)).sum())
        out[f"loss/{label}"] = member_sums[index] / n if n else float("nan")
    return out
