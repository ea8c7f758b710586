"""Layer and component transplants against concrete runs: which run of one arm goes with which run of the
other (per seed), the split (layers, components) against the model's depth and family, and the derived run
(its id and spec). For a grid's `transplants:` block this is checked before anything is submitted;
`ablate transplant` does the same on a sweep's finished runs (ablate.evaluate.transplant).

Matching: the runs of the two arms with the same training identity (model, data, data seed, training
settings: RunSpec.training_identity) and the same seed. A derived run's spec is its `into` run's, with
labels.axes {schedule: "<into>_<from>[<split>]", freeze: "none"}, labels.derived (the provenance) and the
entry's evaluation over the run's: its tasks and seeds replace the run's, its finetune settings are set
over the run's eval.finetune, its protocol replaces the run's. The split is "0-7" for layers, "emb,0-7" when
the embeddings come with them (`embeddings: true`, or layers naming them: ablate.config.transplants), "attention"
/ "mlp" for a component of every block, "8-14:attention" for one within some blocks ("emb,..." again with the
embeddings).

May import: config, plan.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ablate.config.errors import SpecError
from ablate.config.grid import GridSpec
from ablate.config.spec import RunSpec, dump_run_spec
from ablate.config.transplants import (
    TransplantEval,
    arm_name,
    copies_embeddings,
    derived_id,
    entry_split,
    parse_arm,
)
from ablate.plan.freezing import FrozenSet, resolve_freeze
from ablate.plan.grid import PlannedRun


@dataclass(frozen=True)
class PlannedTransplant:
    run_id: str  # the derived run's folder: runs/tx-<digest>
    key: str  # where it was asked for: transplants[i], or --from/--into
    from_id: str
    into_id: str
    spec: RunSpec  # the derived run's spec
    own_tasks: bool  # the entry sets its own evaluation (tasks, seeds, finetune, protocol): checked apart

    @property
    def derived(self) -> dict[str, Any]:
        return self.spec.labels["derived"]


def match_arms(
    source: Mapping[str, RunSpec], target: Mapping[str, RunSpec], names: tuple[str, str]
) -> tuple[list[tuple[str, str]], list[tuple[int, str, str]]]:
    """([(source run, target run)] per identity and seed, in seed order; [(seed, arm, run) of a run whose
    other arm has no run with its identity and seed]). `names`: the two arms, for the second list."""

    def keyed(runs: Mapping[str, RunSpec]) -> dict[tuple[str, int], str]:
        return {(spec.training_identity, spec.seed): rid for rid, spec in runs.items()}

    a, b = keyed(source), keyed(target)
    matched = [(a[k], b[k]) for k in sorted(a.keys() & b.keys(), key=lambda k: (k[1], k[0]))]
    alone = sorted(
        [(k[1], names[0], a[k]) for k in a.keys() - b.keys()]
        + [(k[1], names[1], b[k]) for k in b.keys() - a.keys()]
    )
    return matched, alone


def resolve_split(
    words: tuple[str, ...], components: tuple[str, ...], depth: int, key: str, embeddings: bool = False
) -> tuple[FrozenSet, str]:
    """(what is copied, the split's name). Layers alone: those layers (and what else the words name), with
    the embeddings when `embeddings`. Components: the blocks the words name (embeddings, final norm and head
    are not blocks), SpecError when they name none; the embeddings besides when `embeddings`."""
    if not components:
        chosen = resolve_freeze((*(("embeddings",) if embeddings else ()), *words), depth, key)
        return chosen, chosen.describe()
    blocks = resolve_freeze(words, depth, key).layers
    chosen = FrozenSet(blocks, embeddings=embeddings, encoder_tail=False)
    if not chosen.layers:
        raise SpecError(
            "components are parts of blocks: the layers name no block",
            key=key,
            value=",".join(words),
            allowed="low, mid, high, a range such as 0-7, encoder (every block)",
        )
    parts = "+".join(components)
    where = "emb," if embeddings else ""
    if len(blocks) == depth:
        return chosen, where + parts
    return chosen, f"{where}{FrozenSet(blocks, False, False).describe()}:{parts}"


def derived_spec(
    into: RunSpec,
    from_id: str,
    into_id: str,
    words: tuple[str, ...],
    names: tuple[str, str],
    depth: int,
    key: str,
    tasks: tuple[str, ...] | None = None,
    seeds: tuple[int, ...] | None = None,
    components: tuple[str, ...] = (),
    evaluation: TransplantEval | None = None,
    embeddings: bool = False,
) -> RunSpec:
    """The derived run's spec; SpecError (at `key`) for layers past the model's depth. `tasks` / `seeds`
    (an entry's tasks, the command line's) win over `evaluation`'s; `embeddings`: the from run's embeddings
    are copied too (asked for, or named by the layers: copies_embeddings)."""
    chosen, split = resolve_split(words, components, depth, key, embeddings)
    data = dump_run_spec(into)
    labels = data.get("labels") or {}
    axes = {**(labels.get("axes") or {}), "schedule": f"{names[1]}_{names[0]}[{split}]", "freeze": "none"}
    data["labels"] = {
        **labels,
        "axes": axes,
        "derived": {
            "kind": "transplant",
            "from": from_id,
            "into": into_id,
            "layers": chosen.describe(),
            "words": list(words),
            "components": list(components),
            "embeddings": chosen.embeddings,
            "split": split,
            "from_arm": names[0],
            "into_arm": names[1],
            "whole": not components and chosen == resolve_freeze(("encoder", "head"), depth),
            "eval": scoring_overrides(evaluation),
        },
    }
    evaluation = evaluation or TransplantEval()
    tasks = tasks if tasks is not None else evaluation.tasks
    seeds = seeds if seeds is not None else evaluation.seeds
    if tasks is not None:
        data["eval"]["tasks"] = list(tasks)
    if seeds is not None:
        data["eval"]["seeds"] = list(seeds)
    data["eval"]["finetune"] = {**data["eval"].get("finetune", {}), **evaluation.finetune}
    if evaluation.protocol is not None:
        data["eval"]["protocol"] = evaluation.protocol
    return RunSpec.model_validate(data)


def scoring_overrides(evaluation: TransplantEval | None) -> dict[str, Any]:
    """What of a transplant's evaluation changes how a task is scored (finetune settings, protocol; not
    which tasks or seeds): hybrids and their whole-model references compare only when it is the same."""
    if evaluation is None:
        return {}
    return {k: v for k, v in (("finetune", evaluation.finetune), ("protocol", evaluation.protocol)) if v}


def own_eval(tasks: tuple[str, ...] | None, evaluation: TransplantEval | None) -> bool:
    """Whether a transplant's evaluation differs from its into run's (then it is checked on its own)."""
    return tasks is not None or (evaluation is not None and evaluation.model_dump(exclude_defaults=True) != {})


def plan_transplants(
    grid: GridSpec, runs: list[PlannedRun], models: dict[str, tuple], file: str | None = None
) -> tuple[list[PlannedTransplant], list[str]]:
    """Every derived run of the grid's `transplants:` block, and warnings (runs of one arm whose seed the
    other arm lacks: they get no hybrid). SpecError: an arm the grid does not expand to, two arms with no
    seed in common, layers past the depth, the same transplant twice. `models`: plan.grid.resolve_models."""
    arms: dict[tuple[str, str], dict[str, RunSpec]] = {}
    for run in runs:
        arms.setdefault((run.axes["schedule"], run.axes["freeze"]), {})[run.run_id] = run.spec
    planned: list[PlannedTransplant] = []
    warnings: list[str] = []
    seen: dict[str, str] = {}
    for i, entry in enumerate(grid.transplants):
        key = f"transplants[{i}]"
        try:
            pair = tuple(
                _arm(text, f"{key}.{side}", arms)
                for side, text in (("from", entry.source), ("into", entry.target))
            )
            names = (arm_name(pair[0]), arm_name(pair[1]))
            if pair[0] == pair[1]:
                raise SpecError(
                    "from and into are the same arm (the hybrid would be the run itself)",
                    key=f"{key}.into",
                    value=entry.target,
                )
            words, components = entry_split(entry, key)
            embeddings = copies_embeddings(words, components, entry.embeddings)
            matched, alone = match_arms(arms[pair[0]], arms[pair[1]], names)
            if not matched:
                raise SpecError(
                    f"arms {names[0]} and {names[1]} have no run with the same seed and training settings",
                    key=key,
                    value=f"{names[0]} -> {names[1]}",
                )
            warnings += [
                f"{key}: run {rid} (arm {arm}, seed {seed}) has no run of the other arm with its seed "
                "and training settings: no hybrid for it"
                for seed, arm, rid in alone
            ]
            for from_id, into_id in matched:
                into = arms[pair[1]][into_id]
                family, depth = models[into.model]
                family.check_components(components, f"{key}.components")
                spec = derived_spec(
                    into,
                    from_id,
                    into_id,
                    words,
                    names,
                    depth,
                    f"{key}.layers",
                    entry.tasks,
                    components=components,
                    evaluation=entry.eval,
                    embeddings=embeddings,
                )
                rid = derived_id(from_id, into_id, words, components, embeddings)
                if rid in seen:
                    raise SpecError(
                        f"the same transplant as {seen[rid]}",
                        key=key,
                        value=f"{names[0]} -> {names[1]} [{spec.labels['derived']['split']}]",
                    )
                seen[rid] = key
                planned.append(
                    PlannedTransplant(rid, key, from_id, into_id, spec, own_eval(entry.tasks, entry.eval))
                )
        except SpecError as exc:
            raise SpecError(exc.message, file=file, key=exc.key, value=exc.value, allowed=exc.allowed) from None
    return planned, warnings


def _arm(text: str, key: str, arms: Mapping[tuple[str, str], Any]) -> tuple[str, str]:
    arm = parse_arm(text, key)
    if arm not in arms:
        raise SpecError(
            "not an arm this grid expands to", key=key, value=text, allowed=", ".join(arm_name(a) for a in arms)
        )
    return arm


def transplant_table(planned: list[PlannedTransplant]) -> list[dict[str, Any]]:
    """One row per derived run for --dry-run (embeddings_of: the arm whose embeddings the hybrid has)."""
    return [
        {
            "run_id": t.run_id,
            "entry": t.key,
            "schedule": t.spec.labels["axes"]["schedule"],
            "seed": t.spec.seed,
            "from_run": t.from_id,
            "into_run": t.into_id,
            "embeddings_of": t.derived["from_arm" if t.derived["embeddings"] else "into_arm"],
            "tasks": ",".join(t.spec.eval.tasks) or "-",
        }
        for t in planned
    ]
