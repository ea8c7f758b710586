"""A step's gradient norms, per layer group and in total, from one multi-tensor pass, and clipping by the
total: what the loop logs and what `optim.grad_clip` scales by, nothing read back to the host.

torch._foreach_norm takes every gradient's L2 norm in a handful of fused launches (a loop over the parameters
would launch one reduction per parameter, hundreds per step). From those norms:

- each layer group's norm (the layers table's grad_norm): the group's norms combined in float64, as
  tests/probe_reference.py computes it one parameter at a time;
- the total over every trainable gradient and the clipping coefficient, exactly as
  torch.nn.utils.clip_grad_norm_ forms them (the norm of the per-gradient norms in their dtype, then
  max_norm / (total + 1e-6) clamped to 1): the same numbers as calling it, without its second pass.

May import: nothing from ablate. Torch only.
"""

from __future__ import annotations

from typing import Mapping

import torch

CLIP_EPS = 1e-6  # clip_grad_norm_'s


def step_norms(
    named: Mapping[str, torch.nn.Parameter],
    groups: Mapping[int, list[str]],
    trainable: list[torch.nn.Parameter],
    max_norm: float | None,
) -> tuple[tuple[int, ...], torch.Tensor]:
    """(layers with gradients among `trainable`, their L2 norms (float64, on the gradients' device)); with
    `max_norm`, every trainable gradient then scaled in place by clip_grad_norm_'s coefficient, computed from
    the same norms."""
    params = [p for p in trainable if p.grad is not None]
    if not params:
        return (), torch.zeros(0, dtype=torch.float64)
    grads = [p.grad for p in params]
    norms = torch._foreach_norm(grads)
    position = {id(p): i for i, p in enumerate(params)}
    layers, values = [], []
    for layer, names in groups.items():
        mine = [norms[position[id(named[n])]] for n in names if id(named[n]) in position]
        if mine:
            layers.append(layer)
            values.append(torch.linalg.vector_norm(torch.stack(mine).double()))
    if max_norm is not None:
        total = torch.linalg.vector_norm(torch.stack(norms))
        torch._foreach_mul_(grads, torch.clamp(max_norm / (total + CLIP_EPS), max=1.0))
    return tuple(layers), torch.stack(values) if values else torch.zeros(0, dtype=torch.float64)
