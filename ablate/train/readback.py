"""Each step's loss and per-layer gradient norms kept on the device until the loop needs them as numbers.

A GPU runs ahead of the Python that queues its work; reading a value back (`.item()`, `float(t)`) makes the
host wait for everything queued before it. A training step that read its loss and its norms would wait once
per micro-batch and once per layer, every step. So the loop books each step's tensors here and reads them all
in one go (one stack, one copy to the host) at its boundaries: a log line, a phase end, a checkpoint. Every
step still lands in the curves and gradient-norm rows, with the values it always had (the same float64
numbers, added in the same order). A loss that is not finite raises at the first boundary after it, naming
its step; no checkpoint is written before that boundary's read.

May import: train.checkpoint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ablate.train.checkpoint import TrainState


@dataclass
class StepValues:
    """What one step computed, unread: its place in the run and its device tensors."""

    phase: str
    step: int
    tokens: int
    lr: float
    loss: torch.Tensor  # 0-dim
    layers: tuple[int, ...]  # layers with a gradient norm
    norms: torch.Tensor  # (len(layers),) float64
    notes: dict = field(default_factory=dict)  # the curves' extra columns: numbers, or 0-dim device tensors


@dataclass
class Unread:
    """The steps booked since the last read."""

    steps: list[StepValues] = field(default_factory=list)

    def add(
        self,
        state: TrainState,
        phase: str,
        lr: float,
        loss: torch.Tensor,
        norms: tuple[tuple[int, ...], torch.Tensor],
        notes: dict | None = None,
    ) -> None:
        """Book the step `state` has just advanced to (`notes`: its extra curve columns, ablate.train.batches)."""
        self.steps.append(
            StepValues(phase, state.global_step, state.tokens_seen, lr, loss.detach(), *norms, dict(notes or {}))
        )

    def settle(self, state: TrainState) -> None:
        """Read every booked step back at once and record it in `state` (curves, gradient norms)."""
        if not self.steps:
            return
        tensor_notes = [[k for k, v in s.notes.items() if isinstance(v, torch.Tensor)] for s in self.steps]
        flat = torch.cat(
            [
                torch.cat(
                    [
                        s.loss.reshape(1).double(),
                        s.norms.to(s.loss.device),
                        *(s.notes[k].reshape(1).double().to(s.loss.device) for k in keys),
                    ]
                )
                for s, keys in zip(self.steps, tensor_notes)
            ]
        )
        values = flat.cpu().tolist()
        at = 0
        for s, keys in zip(self.steps, tensor_notes):
            loss, norms = values[at], values[at + 1 : at + 1 + len(s.layers)]
            at += 1 + len(s.layers)
            notes = {**s.notes, **dict(zip(keys, values[at : at + len(keys)]))}
            at += len(keys)
            if not math.isfinite(loss):
                self.steps.clear()
                raise FloatingPointError(f"loss is {loss} at step {s.step} (phase {s.phase})")
            state.book_step(s.phase, s.step, s.tokens, loss, s.lr, dict(zip(s.layers, norms)), notes)
        self.steps.clear()
