"""The cost plan's tokens by objective, per phase: a mixture's members counted each (ablate.plan.cost counts
a run's tokens as a whole).

A phase's tokens are its steps x the tokens of a step. A mixture's member trains a share of them: its weight
over the members' weights, the expected share of the member draws (each step, micro-batch or sequence draws
one member with the weights; a run's own draws are in its curves, `loss/<member>`). Two members of one
objective (MLM at two rates) add up under it. Like the cost table, it counts what is trained: a run that
starts from another run's checkpoint (ablate.plan.branching) its steps after the branch step.

May import: config, plan.
"""

from __future__ import annotations

from typing import Any

from ablate.config import objectives
from ablate.config.spec import PhaseSpec, RunSpec
from ablate.plan.cost import steps_after

TOTAL = "all runs"  # the last row's label (the cost table's own last row is "total")


def objective_shares(phase: PhaseSpec) -> dict[str, float]:
    """Objective -> its share of the phase's tokens: 1.0 for a single objective, a mixture's members by
    their weights (members of one objective added up)."""
    members = objectives.leaves(phase)
    total = sum(weight for _, _, weight in members)
    shares: dict[str, float] = {}
    for entry, _params, weight in members:
        shares[entry.name] = shares.get(entry.name, 0.0) + weight / total
    return shares


def phase_objective_tokens(spec: RunSpec, start: int = 0) -> list[tuple[str, int, dict[str, float]]]:
    """Per phase of the spec: (name, steps trained, objective -> tokens), from global step `start` on (a
    branched run's steps after its branch step; 0: every step)."""
    steps = steps_after(spec, start) if start else spec.phase_steps()
    return [
        (
            phase.name,
            n,
            {name: n * spec.tokens_per_step * share for name, share in objective_shares(phase).items()},
        )
        for phase, n in zip(spec.phases, steps)
    ]


def _cell(tokens: float | None) -> str:
    return "" if tokens is None else f"{round(tokens):,}"


def objective_rows(runs: list[tuple[str, dict, RunSpec, int]]) -> list[dict[str, Any]]:
    """One row per trained phase of each (run id, axes, spec, branch step) with a column per objective (in
    first-seen order) holding its tokens, then a row of each objective's tokens over all runs."""
    per_phase = [
        (rid, axes, name, n, tokens)
        for rid, axes, spec, start in runs
        for name, n, tokens in phase_objective_tokens(spec, start)
        if n
    ]
    columns = list(dict.fromkeys(obj for *_, tokens in per_phase for obj in tokens))
    rows = [
        {"run_id": rid, **axes, "phase": name, "steps": n, **{c: _cell(tokens.get(c)) for c in columns}}
        for rid, axes, name, n, tokens in per_phase
    ]
    axes_keys = dict.fromkeys(k for _, axes, *_ in per_phase for k in axes)
    totals = {c: sum(tokens.get(c, 0.0) for *_, tokens in per_phase) for c in columns}
    return rows + [
        {
            "run_id": TOTAL,
            **{k: "" for k in axes_keys},
            "phase": "",
            "steps": "",
            **{c: _cell(v) for c, v in totals.items()},
        }
    ]
