"""What a run's pretraining seed changes, phase by phase, and whether runs that differ only in it are
independent replicates. Read from the spec and the model's config (no weights).

The seed (RunSpec.seed) reaches a run in three places (ablate.train.loop, ablate.models.loading):
    its objective   what the phase's objective entry declares as random_draws (MLM masking, span masking,
                    a prefix split, a mixture's member draw): each step draws them from (seed, step)
    dropout         each step draws its dropout from (seed, step): only if the config has non-zero dropout
    initialisation  weights the checkpoint lacks are drawn from it: the MLM head of a checkpoint saved without
                    one (a bare encoder), every weight of a `config:` source
Data order never depends on it: it is data.data_seed's alone. A phase that draws nothing from the seed and
starts from weights no earlier draw changed computes the same thing for every seed: seeds that only differ
there are not replicates of it. A run's seed is an independent replicate when its first phase (hence every
phase) depends on it.

May import: config, models.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ablate.config import objectives
from ablate.config.spec import RunSpec

# Dropout of the fine-tuning classifier only: pretraining never runs it.
_FINETUNE_ONLY = ("classifier_dropout",)
SEED_AXES = ("seed", "data.data_seed")


@dataclass(frozen=True)
class PhaseSeedEffect:
    phase: str
    objective: str
    own: tuple[str, ...]  # what the seed changes within the phase: its objective's draws, "dropout"
    inherited: str | None  # where the phase's starting weights already depend on the seed, or None

    @property
    def changes_nothing(self) -> bool:
        return not self.own and self.inherited is None

    def describe(self) -> str:
        if self.own:
            return ", ".join(self.own)
        return "nothing of its own (starts from weights the seed changed)" if self.inherited else "nothing"


def dropouts(config) -> dict[str, float]:
    """The config's non-zero dropout probabilities that pretraining applies."""
    return {
        k: float(v)
        for k, v in config.to_dict().items()
        if "dropout" in k
        and k not in _FINETUNE_ONLY
        and isinstance(v, (int, float))
        and not isinstance(v, bool)
        and v > 0
    }


def seeded_init(config, source_kind: str) -> str | None:
    """Which weights a run draws from its seed before training: all of them (random init), the MLM head
    (a checkpoint whose architectures name no *ForMaskedLM), or none."""
    if source_kind == "config":
        return "every weight (random init)"
    if not any(str(a).endswith("ForMaskedLM") for a in (getattr(config, "architectures", None) or [])):
        return "the MLM head (not in the checkpoint)"
    return None


def seed_effects(spec: RunSpec, config, source_kind: str) -> list[PhaseSeedEffect]:
    """Per phase of `spec`: what the pretraining seed changes in it (config: the model's, without weights;
    source_kind: ablate.models.loading.resolve_source's kind)."""
    has_dropout = bool(dropouts(config))
    upstream = seeded_init(config, source_kind)
    upstream = f"initialisation of {upstream}" if upstream else None
    out = []
    for phase in spec.phases:
        own = (*random_draws(phase), *(("dropout",) if has_dropout else ()))
        out.append(PhaseSeedEffect(phase.name, phase.objective, own, upstream))
        if own and upstream is None:
            upstream = f"phase {phase.name}"
    return out


def random_draws(phase) -> tuple[str, ...]:
    """What the seed draws in a phase, as its objective entry (a mixture: each member's too) declares."""
    draws = objectives.get(phase.objective).random_draws
    members = [entry.random_draws for entry, _, _ in objectives.leaves(phase)]
    return tuple(dict.fromkeys([*draws, *(d for m in members for d in m)]))


def random_draws_of(objective: str) -> tuple[str, ...]:
    return objectives.get(objective).random_draws


def is_seed_independent(effects: list[PhaseSeedEffect]) -> bool:
    return bool(effects) and not effects[0].changes_nothing


def seed_record(spec: RunSpec) -> dict[str, Any]:
    """For records/run.json: seed_independent, and seed_changes ("phase: what; ...")."""
    effects = _effects_of(spec)
    return {
        "seed_independent": is_seed_independent(effects),
        "seed_changes": "; ".join(f"{e.phase}: {e.describe()}" for e in effects),
    }


def _effects_of(spec: RunSpec) -> list[PhaseSeedEffect]:
    from ablate.models.loading import load_config, resolve_source

    return seed_effects(spec, load_config(spec.model), resolve_source(spec.model)[0])


def _why_nothing(effect: PhaseSeedEffect, config, first: bool) -> str:
    reasons = [
        "dropout 0" if not dropouts(config) else "",
        f"{effect.objective.upper()} draws nothing from the seed" if not random_draws_of(effect.objective) else "",
        "data order from data.data_seed",
        "the checkpoint has its MLM head" if first else "the phases before it do not depend on the seed",
    ]
    return ", ".join(r for r in reasons if r)


def seed_notes(runs: list) -> tuple[list[str], list[str]]:
    """(notes, warnings) for a dry run: per seed axis of the grid (an axis `seed` or `data.data_seed`), what
    a seed changes in each phase, per model and schedule; a warning for each phase that a `seed` axis
    repeats without any change. `runs`: ablate.plan.grid.PlannedRun."""
    from ablate.models.loading import load_config, resolve_source

    notes: list[str] = []
    warnings: list[str] = []
    axes = [a for a in SEED_AXES if any(a in r.axes for r in runs)]
    if "data.data_seed" in axes:
        values = sorted({r.axes["data.data_seed"] for r in runs if "data.data_seed" in r.axes})
        notes.append(
            f"seed axis data.data_seed {values}: changes the data order of every phase (runs with the "
            "same data seed read the same token stream)"
        )
    if "seed" not in axes:
        return notes, warnings
    groups: dict[tuple, list] = {}
    for run in runs:
        key = (run.spec.model, tuple((p.name, p.objective) for p in run.spec.phases))
        groups.setdefault(key, []).append(run)
    seeds = sorted({r.spec.seed for r in runs})
    notes.append(
        f"seed axis seed {seeds}: what a pretraining seed changes per phase (never the data order: "
        "data.data_seed's)"
    )
    for (model, _), members in groups.items():
        config = load_config(model)
        effects = seed_effects(members[0].spec, config, resolve_source(model)[0])
        schedules = "/".join(dict.fromkeys(str(r.axes.get("schedule", "-")) for r in members))
        notes.append(
            f"  {model}, schedule {schedules}: "
            + "; ".join(f"{e.phase}: {e.describe()}" for e in effects)
            + ("" if is_seed_independent(effects) else "  (not independent replicates)")
        )
        n = len({r.spec.seed for r in members})
        for i, e in enumerate(effects):
            if e.changes_nothing and n > 1:
                warnings.append(
                    f"seed changes nothing in phase {e.phase} for {model}: "
                    f"{_why_nothing(e, config, i == 0)}: the {n} seeds repeat the same "
                    f"{e.objective.upper()} computation"
                )
    return notes, warnings
