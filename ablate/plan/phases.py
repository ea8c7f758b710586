"""The phase plan of a run: each phase's length in optimizer steps and what it freezes, resolved against the
model's depth once, and recorded as data (the `frozen` table: run_id, phase, layer).

May import: config, models.
"""

from __future__ import annotations

from dataclasses import dataclass

from ablate.config.errors import SpecError
from ablate.config.spec import PhaseSpec, RunSpec
from ablate.plan.freezing import FrozenSet, resolve_freeze

EMBEDDINGS = -1  # the `layers` and `frozen` tables' index of the embedding block


@dataclass(frozen=True)
class PhasePlan:
    """A phase resolved against the model: concrete steps and frozen layers."""

    index: int
    spec: PhaseSpec
    steps: int
    frozen: FrozenSet
    first_step: int = 0  # the run's global step at which the phase starts

    @property
    def name(self) -> str:
        return self.spec.name


def plan_phases(spec: RunSpec, depth: int) -> list[PhasePlan]:
    """Resolve lengths and freeze masks; a phase that would train nothing is an error."""
    plans, first = [], 0
    for i, (phase, steps) in enumerate(zip(spec.phases, spec.phase_steps())):
        frozen = resolve_freeze(phase.freeze, depth, key=f"phases[{i}].freeze")
        plans.append(PhasePlan(i, phase, steps, frozen, first))
        first += steps
    return plans


def frozen_rows(plans: list[PhasePlan]) -> list[dict]:
    """One row per (phase, frozen layer): -1 for the embeddings, 0..n-1 for blocks (head and final norm are
    not layers of the figures)."""
    rows = []
    for plan in plans:
        layers = ([EMBEDDINGS] if plan.frozen.embeddings else []) + sorted(plan.frozen.layers)
        rows += [{"phase": plan.name, "layer": layer} for layer in layers]
    return rows


def plan_for(spec: RunSpec) -> list[PhasePlan]:
    """The plan against the depth in the model's config (no weights loaded)."""
    from ablate.models.families import n_layers
    from ablate.models.loading import load_config

    return plan_phases(spec, n_layers(load_config(spec.model)))


def check_plan(spec: RunSpec, file: str | None = None) -> list[PhasePlan]:
    """plan_for, with a bad freeze range reported against the run spec's file."""
    try:
        return plan_for(spec)
    except SpecError as exc:
        raise SpecError(exc.message, file=file, key=exc.key, value=exc.value, allowed=exc.allowed) from None
