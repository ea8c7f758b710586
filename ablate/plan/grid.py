"""Grid expansion: a validated grid file -> the ordered list of PlannedRuns (RunSpec + axis values + where each
phase was written), the phase plans of each run against its model's depth, and the dry-run table.

Expansion is a pure function of the file: the same grid always gives the same runs in the same order.

May import: config, models, plan.
"""

from __future__ import annotations

import copy
import itertools
import re
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import ValidationError

from ablate.config.base import spec_error_from, validate
from ablate.config.errors import SpecError
from ablate.config.grid import (
    DEFAULT_BASELINE,
    NAMED_AXES,
    baseline_label,
    RESERVED_AXES,
    GridSpec,
    as_list,
    axis_key,
)
from ablate.config import objectives
from ablate.config.spec import FREEZE_WORDS, PhaseSpec, RunSpec
from ablate.plan.data_choices import apply_data_choice, check_named_phases


@dataclass(frozen=True)
class PhaseOrigin:
    """Where a run's phase was written in the grid, to point errors found later (against the model) there."""

    key: str  # prelude[i] or schedules.<name>[j]
    mask_key: str | None = None  # freeze_masks.<mask>.<phase>, when a freeze mask adds to the phase
    mask_groups: tuple[str, ...] = ()  # what the mask adds
    data_key: str | None = None  # data_choices.<choice>.<phase>, when a data choice sets its data

    def written(self, rest: str, value: Any = None) -> str:
        """Where the phase's key `rest` (.freeze, .data.corpus) was written in the grid."""
        if self.mask_key and rest.startswith(".freeze") and (value is None or str(value) in self.mask_groups):
            return self.mask_key
        if self.data_key and rest.startswith(".data"):
            return self.data_key + rest[len(".data") :]
        return self.key + rest


@dataclass(frozen=True)
class PlannedRun:
    spec: RunSpec
    axes: dict[str, Any]
    origins: tuple[PhaseOrigin, ...] = ()
    run_id: str = field(init=False, default="")

    def __post_init__(self):
        object.__setattr__(self, "run_id", self.spec.run_id)  # hashed once, not at every use

    def locate(self, key: str | None, value: Any = None) -> str | None:
        """A RunSpec key (phases[2].freeze) as the grid key it came from (freeze_masks.low_clm.clm)."""
        m = re.match(r"^phases\[(\d+)\](.*)$", key or "")
        if not m or int(m.group(1)) >= len(self.origins):
            return key
        return self.origins[int(m.group(1))].written(m.group(2), value)


def _assignments(grid: GridSpec) -> list[dict[str, Any]]:
    """The cartesian product of the axes and zipped groups, minus excluded combinations."""
    factors: list[list[dict[str, Any]]] = [[{name: v} for v in values] for name, values in grid.axes.items()]
    for group in grid.zip:
        keys = list(group)
        factors.append([dict(zip(keys, row)) for row in zip(*(group[k] for k in keys))])
    out = []
    for combo in itertools.product(*factors):
        assignment: dict[str, Any] = {}
        for part in combo:
            assignment.update(part)
        if not any(_matches(rule, assignment) for rule in grid.exclude):
            out.append(assignment)
    return out


def _matches(rule: dict[str, Any], assignment: dict[str, Any]) -> bool:
    """A rule matches when every axis it names has the value given, or one of the values listed."""
    for k, wanted in rule.items():
        value = assignment.get(k)
        if value != wanted and not (isinstance(wanted, list) and value in wanted):
            return False
    return True


def _own(value: Any) -> Any:
    """A run's own copy of a value from the grid (only containers need one)."""
    return copy.deepcopy(value) if isinstance(value, (list, dict)) else value


def set_path(target: dict, dotted: str, value: Any, file: str | None = None, where: str | None = None) -> None:
    """Set a dotted key, copying the mappings on the way: the grid's own mappings are shared by every run."""
    keys = dotted.split(".")
    for k in keys[:-1]:
        child = target.get(k)
        if child is None:
            child = {}
        elif isinstance(child, dict):
            child = dict(child)
        else:
            raise SpecError(
                f"key path goes through {k!r}, which is not a mapping here",
                file=file,
                key=where or f"axes.{dotted}",
                value=child if isinstance(child, (str, int, float)) else None,
            )
        target[k] = child
        target = child
    target[keys[-1]] = _own(value)


def _phases(
    grid: GridSpec, schedule: str, mask_name: str, data_name: str | None = None
) -> tuple[list[dict], list[PhaseOrigin]]:
    """The prelude and the schedule's phases (as written), with the freeze mask and the data choice merged in,
    and their origins."""
    phases = [copy.deepcopy(dict(p)) for p in (*grid.prelude, *grid.schedules[schedule])]
    n_prelude = len(grid.prelude)
    keys = [
        f"prelude[{i}]" if i < n_prelude else f"schedules.{schedule}[{i - n_prelude}]" for i in range(len(phases))
    ]
    for p, key in zip(phases, keys):
        if "name" in p and not isinstance(p["name"], str):  # masks and data choices look phases up by name
            raise SpecError(
                "a phase's name is a string",
                key=f"{key}.name",
                value=type(p["name"]).__name__,
                allowed="letters, digits, _ . -",
            )
    mask = grid.freeze_masks.get(mask_name, {})
    check_named_phases("freeze mask", "freeze_masks", mask_name, mask, schedule, phases)
    origins = []
    for p, key in zip(phases, keys):
        if p.get("name") in mask:
            extra = [str(g) for g in as_list(mask[p["name"]])]
            own = [str(g) for g in as_list(p.get("freeze", ["none"]))]
            merged = [g for g in own if g != "none"] + [g for g in extra if g != "none"]
            p["freeze"] = merged or ["none"]
            origins.append(PhaseOrigin(key, f"freeze_masks.{mask_name}.{p['name']}", tuple(extra)))
        else:
            origins.append(PhaseOrigin(key))
    for i, data_key in apply_data_choice(grid, phases, schedule, data_name).items():
        origins[i] = replace(origins[i], data_key=data_key)
    return phases, origins


def _phase_specs(
    grid: GridSpec, schedule: str, mask_name: str, data_name: str | None, file: str | None
) -> tuple[tuple[PhaseSpec, ...], tuple[PhaseOrigin, ...]]:
    """Validated phases of one schedule x freeze mask x data choice (shared, immutable, by every run that uses
    them)."""
    try:
        phases, origins = _phases(grid, schedule, mask_name, data_name)
    except SpecError as exc:
        raise SpecError(exc.message, file=file, key=exc.key, value=exc.value, allowed=exc.allowed) from None
    names = [p.get("name") for p in phases]
    for i, name in enumerate(names):
        if name is not None and name in names[:i]:
            raise SpecError(
                "phase names must be unique within a schedule and the prelude",
                file=file,
                key=f"{origins[i].key}.name",
                value=name,
            )
    specs = []
    for phase, origin in zip(phases, origins):
        try:
            specs.append(validate(PhaseSpec, phase, file, "phase", prefix=origin.key))
        except SpecError as exc:
            mine = origin.data_key and (exc.key or "").startswith(origin.key + ".data")
            key = origin.written(exc.key[len(origin.key) :]) if mine else exc.key
            raise SpecError(exc.message, file=file, key=key, value=exc.value, allowed=exc.allowed) from None
    return tuple(specs), tuple(origins)


def _error_key(key: str, grid: GridSpec, assignment: dict, origins: tuple[PhaseOrigin, ...]) -> str:
    """Map a key of the merged RunSpec back to where it was written in the grid."""
    if key in ("(top level)", ""):
        return "base"
    m = re.match(r"^phases\[(\d+)\](.*)$", key)
    if m and int(m.group(1)) < len(origins):
        origin, rest = origins[int(m.group(1))], m.group(2)
        return origin.written(rest) if origin.data_key and rest.startswith(".data") else origin.key + rest
    for axis in assignment:
        if axis not in NAMED_AXES and (key == axis or key.startswith(axis + ".") or axis.startswith(key + ".")):
            return f"{axis_key(grid, axis)} (= {assignment[axis]!r}): {key}"
    model_choice = assignment.get("model")
    if isinstance(model_choice, str) and model_choice in grid.models:
        for k in grid.models[model_choice]:
            if key == k or key.startswith(k + "."):
                return f"models.{model_choice}.{key}"
    elif model_choice is not None and key == "model":
        return f"{axis_key(grid, 'model')} (= {model_choice!r}): model"
    return f"base.{key}"


def _typed(spec: RunSpec, dotted: str) -> Any:
    obj: Any = spec
    for k in dotted.split("."):
        obj = obj.get(k) if isinstance(obj, dict) else getattr(obj, k, None)
    return obj


def _labels(grid: GridSpec, axes: dict) -> dict:
    """A run's labels: its sweep and axes, and the grid's baseline schedule where it is not the default."""
    labels: dict[str, Any] = {"sweep": grid.sweep, "axes": axes}
    if grid.baseline != DEFAULT_BASELINE:
        labels["baseline"] = baseline_label(grid.baseline)
    return labels


def expand(grid: GridSpec, file: str | None = None) -> list[PlannedRun]:
    """Every run of the grid as a validated RunSpec, in a stable order; duplicates (same id) are an error.

    Each schedule x freeze mask is validated once and its phases shared by the runs that use it."""
    runs: list[PlannedRun] = []
    seen: dict[str, dict] = {}
    default_schedule = next(iter(grid.schedules))
    phase_cache: dict[tuple[str, str, str | None], tuple[tuple[PhaseSpec, ...], tuple[PhaseOrigin, ...]]] = {}
    for assignment in _assignments(grid):
        spec_dict = dict(grid.base)
        model_choice = assignment.get("model")
        if model_choice is not None and model_choice in grid.models:
            for k, v in grid.models[model_choice].items():
                set_path(spec_dict, k, v, file, f"models.{model_choice}.{k}")
        elif model_choice is not None:
            spec_dict["model"] = model_choice
        for axis, value in assignment.items():
            if axis not in NAMED_AXES:
                set_path(spec_dict, axis, value, file, axis_key(grid, axis))
        schedule = assignment.get("schedule", default_schedule)
        mask_name, data_name = assignment.get("freeze", "none"), assignment.get("data")
        cached = phase_cache.get((schedule, mask_name, data_name))
        if cached is None:
            cached = phase_cache[(schedule, mask_name, data_name)] = _phase_specs(
                grid, schedule, mask_name, data_name, file
            )
        spec_dict["phases"], origins = cached
        axes = {"schedule": schedule, "freeze": mask_name, **{k: _own(v) for k, v in assignment.items()}}
        spec_dict["labels"] = _labels(grid, axes)
        try:
            spec = RunSpec.model_validate(spec_dict)
        except ValidationError as exc:
            err = spec_error_from(exc, file, RunSpec, hidden_keys=tuple(RESERVED_AXES))
            raise SpecError(
                err.message,
                file=file,
                key=_error_key(err.key, grid, assignment, origins),
                value=err.value,
                allowed=err.allowed,
            ) from None
        # YAML reads 1e-4 as a string (1.0e-4 is a float); the spec holds the number, and so should the labels
        coerced = {
            k: t
            for k, v in axes.items()
            if k not in NAMED_AXES and isinstance(v, str)
            for t in [_typed(spec, k)]
            if isinstance(t, (int, float)) and not isinstance(t, bool)
        }
        if coerced:
            axes = {**axes, **coerced}
            spec = spec.model_copy(update={"labels": _labels(grid, axes)})
        world = grid.launcher.ranks()
        micro = spec.micro_batch_size if isinstance(spec.micro_batch_size, int) else spec.batch_size // world
        if world > 1 and (micro == 0 or spec.batch_size % (world * micro)):
            raise SpecError(
                f"batch_size must be a multiple of ranks x micro-batch ({world} x {micro}) for the run {axes}",
                file=file,
                key="base.batch_size",
                value=spec.batch_size,
            )
        run = PlannedRun(spec, axes, origins)
        if run.run_id in seen:
            raise SpecError(
                f"two grid points give the same run: {seen[run.run_id]} and {axes}; an axis that changes nothing?",
                file=file,
                key="axes",
                value=axes,
                allowed="axis values that change what a run computes (two schedules or masks with the same phases "
                "are one run)",
            )
        seen[run.run_id] = axes
        runs.append(run)
    if not runs:
        raise SpecError("the grid expands to no runs (every combination excluded?)", file=file, key="exclude")
    return runs


def resolve_models(runs: list[PlannedRun], file: str | None = None) -> dict[str, tuple]:
    """{model source: (family, depth)} from the configs (no weights); a source that is not a model, has no
    family entry, or whose layers the entry cannot find is an error here, before anything is submitted."""
    from ablate.models.loading import model_layout

    models: dict[str, tuple] = {}
    for run in runs:
        source = run.spec.model
        if source not in models:
            try:
                models[source] = model_layout(source)
            except SpecError as exc:
                raise SpecError(
                    exc.message, file=file, key=f"model (= {source})", value=exc.value, allowed=exc.allowed
                ) from None
    return models


def resolve_layers(
    runs: list[PlannedRun], file: str | None = None, models: dict[str, tuple] | None = None
) -> dict[str, list]:
    """Each run's phases against its model's depth (configs only, no weights): freeze ranges past the
    depth are errors here, before anything is submitted. Runs that share a model's depth, phases and
    step size share the work. `models`: resolve_models(runs), when already at hand."""
    from ablate.plan.phases import plan_phases

    models = models if models is not None else resolve_models(runs, file)
    cache: dict[tuple, list] = {}
    plans = {}
    for run in runs:
        source = run.spec.model
        depth = models[source][1]
        key = (depth, run.spec.phases, run.spec.budget_tokens, run.spec.tokens_per_step)
        plan = cache.get(key)
        if plan is None:
            try:
                plan = cache[key] = plan_phases(run.spec, depth)
            except SpecError as exc:
                mask = run.axes.get("freeze", "none")
                raise SpecError(
                    f"{exc.message} (model {source}; run {run.run_id}, freeze mask {mask!r}, "
                    f"schedule {run.axes.get('schedule')!r})",
                    file=file,
                    key=run.locate(exc.key, exc.value),
                    value=exc.value,
                    allowed=exc.allowed or f"layer ranges within 0-{depth - 1}, or " + ", ".join(FREEZE_WORDS),
                ) from None
        plans[run.run_id] = list(plan)
    return plans


def layer_split(depth: int) -> str:
    """'0-7|8-14|15-21': the low | mid | high thirds of a model's blocks."""
    from ablate.plan.freezing import layer_groups

    return "|".join(
        f"{r.start}-{r.stop - 1}" if len(r) > 1 else str(r.start) if len(r) else "none"
        for r in layer_groups(depth).values()
    )


def plan_table(
    runs: list[PlannedRun],
    plans: dict[str, list],
    models: dict[str, tuple] | None = None,
    causal: dict[tuple, str] | None = None,
) -> list[dict[str, Any]]:
    """One row per run for --dry-run: id, axis values, then (given `models`) the family and its low|mid|high
    layer split, (given `causal`: the preflight per model x tokenizer x implementation) the causal check,
    then frozen layers and length of each phase."""
    rows = []
    for run in runs:
        row: dict[str, Any] = {"run_id": run.run_id}
        row.update({k: v for k, v in run.axes.items()})
        if models is not None:
            family, depth = models[run.spec.model]
            row["family"] = family.name
            row["low|mid|high"] = layer_split(depth)
        if causal is not None:
            spec = run.spec
            checked = causal.get((spec.model, spec.tokenizer or spec.model, spec.attn_implementation), "-")
            proven = any(objectives.needs_preflight(p) for p in spec.phases)
            row["causal"] = f"{spec.attn_implementation}:{checked}" if proven and checked != "-" else "-"
        row["phases"] = " > ".join(f"{p.name}:{p.spec.objective}x{p.steps}" for p in plans[run.run_id])
        row["frozen"] = (
            "; ".join(f"{p.name}={p.frozen.describe()}" for p in plans[run.run_id] if not p.frozen.empty) or "-"
        )
        row["tokens"] = sum(p.steps for p in plans[run.run_id]) * run.spec.tokens_per_step
        rows.append(row)
    return rows
