"""A phase's start on the model: the layers its plan freezes (requires_grad per parameter, and the optimizer's
trainable set after it) and the RoPE thetas in effect (ablate.train.rope). Which layers a phase freezes is
decided once, before any weight exists (ablate.plan.freezing, ablate.plan.phases); this applies it.

May import: config, models, plan.
"""

from __future__ import annotations

import torch

from ablate.config.sources import rope_thetas_at
from ablate.models.families import Family
from ablate.plan.freezing import FrozenSet, is_frozen
from ablate.plan.phases import PhasePlan
from ablate.train.rope import set_rope_thetas


def apply_freeze(model: torch.nn.Module, family: Family, frozen: FrozenSet) -> list[str]:
    """Set requires_grad for the phase; returns the names of the trainable parameters.

    A parameter tied to a frozen one (MLM decoder weight = word embeddings) is the same tensor and so
    frozen with it: named_parameters() lists each tensor once, under its first name."""
    trainable = []
    for name, p in model.named_parameters():
        p.requires_grad_(not is_frozen(name, family, frozen))
        if p.requires_grad:
            trainable.append(name)
    return trainable


def start_phase(model: torch.nn.Module, family: Family, plan: PhasePlan, phases, opt) -> None:
    """What a phase sets at its start: its frozen layers (and the optimizer's trainable parameters, `opt`:
    train.optimizer.Optimizer) and the RoPE thetas in effect."""
    apply_freeze(model, family, plan.frozen)
    opt.set_trainable()
    set_rope_thetas(model, family, rope_thetas_at(phases, plan.index))
