"""Optuna studies over RunSpecs: a tune is a sweep whose runs are proposed by a sampler.

    study: lr_freeze                       # results/<study>/ (run folders, tables, optuna.db)
    base: {...}  prelude: [...]  schedules: {...}  freeze_masks: {...}   # as in a grid
    search_space:
      optim.lr: {type: float, low: 1.0e-5, high: 1.0e-3, log: true}    # any dotted RunSpec key
      schedule: {choices: [mlm, clm_detour]}                            # a named schedule
      freeze: {choices: [none, low_clm]}                                # a named freeze mask
      phases.mlm_decay.lr.final_fraction: {low: 0.0, high: 0.5}         # a field of the phase so named
      phases.mlm_decay.mask_rate: {low: 0.1, high: 0.4}
      share.clm.mlm_decay: {low: 0.5, high: 0.9}   # clm's share of the two phases' summed fractions
      freeze_layers.clm: {type: int, low: -1, high: 2}   # freeze layers 0-K of phase clm (-1: none)
    objective: {metric: loss, last_n: 10}        # or {metric: downstream, split: test, name: f1}
    direction: minimize
    sampler: tpe                                 # or {name: tpe|random|grid|cmaes, seed: 0}
    pruner: {name: median, n_startup_trials: 2}  # none | median | successive_halving | threshold
    n_trials: 20
    parallel: 2                                  # trials in flight
    storage: sqlite                              # sqlite | journal | any RDB URL
    enqueue: [{optim.lr: 1.0e-4}]                # trials to run first (the rest of their params sampled)
    launcher: {executor: local, local: {...}, slurm: {...}}

Each trial becomes a RunSpec through a one-point grid (grid.expand), so it gets the same validation, the
same run folder under results/<study>/runs/<run_id>/ and the same tidy tables as a sweep's runs. Run ids
are content hashes: a trial whose parameters give a run that is already done reuses its result.
"""

from __future__ import annotations

import copy
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

from pydantic import Field, ValidationError

from ablate.store import atomic
from ablate.store.lock import FileLock

from ablate.store import rundir

from ablate.store import tables
from ablate.config.errors import SpecError
from ablate.config.grid import GridSpec, Launcher
from ablate.plan.grid import PlannedRun, expand, resolve_layers, set_path
from ablate.config.base import Strict, read_yaml, spec_error_from
from ablate.config.spec import RunSpec

Print = Callable[[str], None]

SAMPLERS = ("tpe", "random", "grid", "cmaes")
PRUNERS = ("none", "median", "successive_halving", "threshold")
SPECIAL_PREFIXES = ("phases.", "freeze_layers.", "share.")
KEY_FORMS = ("a dotted RunSpec key (optim.lr, seed, data.data_seed, ...), schedule, freeze, "
             "phases.<phase>.<field>, freeze_layers.<phase>, share.<phase>.<phase>")
PRUNED_PREFIX = "pruned by optuna"


class Objective(Strict):
    metric: Literal["loss", "downstream"] = "loss"
    last_n: int = Field(default=10, gt=0, description="loss: mean over the final phase's last N steps")
    tasks: tuple[str, ...] | None = Field(default=None, description="downstream: default the base's eval.tasks")
    split: Literal["test", "dev"] = "test"
    name: str | None = Field(default=None, description="downstream metric; default each task's primary one")


class TuneSpec(Strict):
    study: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    base: dict[str, Any]
    prelude: tuple[dict[str, Any], ...] = ()
    schedules: dict[str, tuple[dict[str, Any], ...]]
    freeze_masks: dict[str, dict[str, Any]] = Field(default_factory=lambda: {"none": {}})
    search_space: dict[str, Any] = Field(default_factory=dict)
    objective: Objective = Objective()
    direction: Literal["minimize", "maximize"] | None = None
    sampler: str | dict[str, Any] = "tpe"
    pruner: str | dict[str, Any] = "none"
    n_trials: int = Field(default=10, gt=0)
    parallel: int = Field(default=1, gt=0)
    storage: str = "sqlite"
    enqueue: tuple[dict[str, Any], ...] = ()
    launcher: Launcher = Launcher()

    @property
    def effective_direction(self) -> str:
        return self.direction or ("minimize" if self.objective.metric == "loss" else "maximize")


@dataclass(frozen=True)
class Param:
    key: str
    kind: str                     # float | int | categorical
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: tuple = ()

    def distribution(self):
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        if self.kind == "categorical":
            return CategoricalDistribution(list(self.choices))
        if self.kind == "int":
            return IntDistribution(int(self.low), int(self.high), log=self.log, step=int(self.step or 1))
        return FloatDistribution(float(self.low), float(self.high), log=self.log, step=self.step)

    def extremes(self) -> list:
        return list(self.choices) if self.kind == "categorical" else [self.low, self.high]


@dataclass
class Tune:
    spec: TuneSpec
    file: str | None
    params: dict[str, Param]

    @property
    def study(self) -> str:
        return self.spec.study


# ------------------------------------------------------------------ loading and validation

def _number(value: Any, file, key) -> float:
    """YAML reads 1e-4 as a string (1.0e-4 is a float): accept both, refuse anything else."""
    if isinstance(value, bool):
        raise SpecError("expected a number", file=file, key=key, value=value)
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    raise SpecError("expected a number", file=file, key=key, value=value if isinstance(value, str) else None)


def _parse_param(key: str, raw: Any, file: str | None) -> Param:
    where = f"search_space.{key}"
    if isinstance(raw, list):
        raw = {"choices": raw}
    if not isinstance(raw, dict):
        raise SpecError("a search-space entry must be a mapping (type, low, high, log, step) or a list of choices",
                        file=file, key=where)
    allowed = {"type", "low", "high", "log", "step", "choices"}
    for k in raw:
        if k not in allowed:
            raise SpecError("unknown key", file=file, key=f"{where}.{k}", allowed=", ".join(sorted(allowed)))
    kind = raw.get("type") or ("categorical" if "choices" in raw else None)
    if kind is None:
        lo, hi = raw.get("low"), raw.get("high")
        kind = "int" if isinstance(lo, int) and isinstance(hi, int) and not isinstance(lo, bool) else "float"
    if kind not in ("float", "int", "categorical"):
        raise SpecError("unknown parameter type", file=file, key=f"{where}.type", value=kind,
                        allowed="float, int, categorical")
    if kind == "categorical":
        choices = raw.get("choices")
        if not isinstance(choices, list) or not choices:
            raise SpecError("a categorical parameter needs a non-empty list of choices", file=file,
                            key=f"{where}.choices")
        for c in choices:
            if c is not None and not isinstance(c, (bool, int, float, str)):
                raise SpecError("choices must be numbers, strings, booleans or null", file=file,
                                key=f"{where}.choices", value=str(c))
        extra = set(raw) - {"type", "choices"}
        if extra:
            raise SpecError("a categorical parameter takes only choices", file=file, key=f"{where}.{sorted(extra)[0]}")
        return Param(key, "categorical", choices=tuple(choices))
    if "choices" in raw:
        raise SpecError(f"a {kind} parameter takes low/high, not choices", file=file, key=f"{where}.choices")
    for bound in ("low", "high"):
        if bound not in raw:
            raise SpecError(f"a {kind} parameter needs {bound}", file=file, key=f"{where}.{bound}")
    low, high = _number(raw["low"], file, f"{where}.low"), _number(raw["high"], file, f"{where}.high")
    log = raw.get("log", False)
    if not isinstance(log, bool):
        raise SpecError("log must be true or false", file=file, key=f"{where}.log", value=log)
    step = raw.get("step")
    if step is not None:
        step = _number(step, file, f"{where}.step")
        if step <= 0:
            raise SpecError("step must be positive", file=file, key=f"{where}.step", value=step)
        if log:
            raise SpecError("log scale and step cannot be combined", file=file, key=f"{where}.step", value=step)
    if kind == "int":
        for name, v in (("low", low), ("high", high)):
            if float(v) != int(v):
                raise SpecError("an int parameter needs whole-number bounds", file=file, key=f"{where}.{name}", value=v)
        low, high = int(low), int(high)
        step = int(step) if step is not None else None
    else:
        low, high = float(low), float(high)
    if low > high:
        raise SpecError(f"low > high ({low} > {high})", file=file, key=f"{where}.low", value=low,
                        allowed=f"a value <= {high}")
    if log and low <= 0:
        raise SpecError("a log-scale parameter needs positive bounds", file=file, key=f"{where}.low", value=low,
                        allowed="low > 0 (or log: false)")
    return Param(key, kind, low=low, high=high, log=log, step=step)


def _phase_names(spec: TuneSpec) -> list[str]:
    names = [p.get("name") for p in spec.prelude] + [p.get("name") for s in spec.schedules.values() for p in s]
    return list(dict.fromkeys(n for n in names if isinstance(n, str)))


def _check_key(param: Param, spec: TuneSpec, file: str | None) -> None:
    key, where = param.key, f"search_space.{param.key}"
    phases = _phase_names(spec)
    if key in ("schedule", "freeze"):
        table = spec.schedules if key == "schedule" else spec.freeze_masks
        if param.kind != "categorical":
            raise SpecError(f"{key} picks named entries: give choices", file=file, key=where, allowed=", ".join(table))
        for c in param.choices:
            if not isinstance(c, str) or c not in table:
                raise SpecError(f"unknown {key} name", file=file, key=f"{where}.choices", value=c,
                                allowed=", ".join(table))
        return
    if key.startswith(SPECIAL_PREFIXES):
        parts = key.split(".")
        prefix = parts[0]
        names = parts[1:2] if prefix != "share" else parts[1:3]
        if (prefix == "phases" and len(parts) < 3) or (prefix == "freeze_layers" and len(parts) != 2) or (
                prefix == "share" and len(parts) != 3):
            raise SpecError("malformed key", file=file, key=where, value=key, allowed=KEY_FORMS)
        for n in names:
            if n not in phases:
                raise SpecError("names a phase that no schedule (or the prelude) has", file=file, key=where,
                                value=n, allowed=", ".join(phases))
        if prefix == "phases" and parts[2] == "name":
            raise SpecError("a phase's name cannot be searched", file=file, key=where)
        if prefix == "share" and (param.kind == "categorical" and not all(
                isinstance(c, (int, float)) and 0 < c < 1 for c in param.choices)
                or param.kind != "categorical" and not (0 < param.low and param.high < 1)):
            raise SpecError("a share is a fraction strictly between 0 and 1", file=file, key=where,
                            allowed="0 < low <= high < 1")
        return
    top = key.split(".")[0]
    if top in ("phases", "labels"):
        raise SpecError("this key cannot be searched directly", file=file, key=where, allowed=KEY_FORMS)
    if top not in RunSpec.model_fields:
        raise SpecError("unknown field", file=file, key=where, value=key,
                        allowed=KEY_FORMS + "; RunSpec fields: " + ", ".join(
                            k for k in RunSpec.model_fields if k not in ("phases", "labels")))


def load_tune(path: str | Path, storage: str | None = None) -> Tune:
    """Read and check a tune file: every parameter's bounds and every choice give a valid run (against the
    model's depth, too), the objective is one the runs can provide. Nothing is run or submitted."""
    file = str(path)
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise SpecError("a tune file must be a mapping", file=file)
    try:
        spec = TuneSpec.model_validate(data)
    except ValidationError as exc:
        raise spec_error_from(exc, file) from None
    if storage:
        spec = spec.model_copy(update={"storage": storage})
    if not spec.schedules:
        raise SpecError("at least one schedule is needed", file=file, key="schedules")
    if not spec.search_space:
        raise SpecError("the search space is empty", file=file, key="search_space",
                        allowed="at least one parameter: " + KEY_FORMS)
    params = {k: _parse_param(k, v, file) for k, v in spec.search_space.items()}
    for p in params.values():
        _check_key(p, spec, file)
    tune = Tune(spec, file, params)
    _check_sampler(tune)
    _check_pruner(tune)
    for i, fixed in enumerate(spec.enqueue):
        if not isinstance(fixed, dict):
            raise SpecError("an enqueued trial is a mapping of parameters", file=file, key=f"enqueue[{i}]")
        for k, v in fixed.items():
            if k not in params:
                raise SpecError("not a search-space parameter", file=file, key=f"enqueue[{i}].{k}", value=k,
                                allowed=", ".join(params))
            if not _in_range(params[k], v):
                raise SpecError("outside the parameter's range", file=file, key=f"enqueue[{i}].{k}", value=v)
    _check_runs(tune)
    return tune


def _in_range(param: Param, value: Any) -> bool:
    dist = param.distribution()
    try:
        return bool(dist._contains(dist.to_internal_repr(value)))
    except (ValueError, TypeError):
        return False


def _check_runs(tune: Tune) -> None:
    """Build the run for each parameter at each bound (each choice), the others at their first value."""
    first = {k: p.extremes()[0] for k, p in tune.params.items()}
    planned: list[PlannedRun] = []
    where: list[str] = []
    spec = tune.spec
    prelude = {p.get("name") for p in spec.prelude}
    schedules = list(tune.params["schedule"].choices) if "schedule" in tune.params else [next(iter(spec.schedules))]
    for k, p in tune.params.items():
        point0 = dict(first)
        if k.startswith(SPECIAL_PREFIXES):   # check it where its phase(s) exist
            needed = set(k.split(".")[1:3] if k.startswith("share.") else k.split(".")[1:2]) - prelude
            having = [s for s in schedules if needed <= {ph.get("name") for ph in spec.schedules[s]}]
            if not having:
                raise SpecError("no schedule the trials can use has this parameter's phase(s)", file=tune.file,
                                key=f"search_space.{k}", value=", ".join(sorted(needed)),
                                allowed="schedules: " + ", ".join(schedules))
            if "schedule" in tune.params:
                point0["schedule"] = having[0]
        for v in p.extremes():
            point = {**point0, k: v}
            try:
                planned.append(trial_run(tune, point, trial=None))
            except SpecError as exc:
                raise SpecError(f"gives an invalid run ({exc.key}: {exc.message})", file=tune.file,
                                key=f"search_space.{k}", value=v, allowed=exc.allowed) from None
            where.append(f"search_space.{k} (= {v!r})")
    for fixed in tune.spec.enqueue:
        planned.append(trial_run(tune, {**first, **fixed}, trial=None))
        where.append("enqueue")
    # freeze ranges against the model's depth, one run at a time so the error names the parameter
    for run, w in zip(planned, where):
        try:
            resolve_layers([run], file=tune.file)
        except SpecError as exc:
            raise SpecError(f"gives an invalid run: {exc.message}", file=tune.file, key=w,
                            value=exc.value, allowed=exc.allowed) from None
    _check_objective(tune, planned[0].spec)
    from ablate.evaluate.runs import check_eval
    from ablate.train.preflight import check_models

    check_eval([planned[0].spec], file=tune.file)
    check_models([run.spec for run in planned], file=tune.file)   # tokenizer, causal preflight


def _check_objective(tune: Tune, spec: RunSpec) -> None:
    obj = tune.spec.objective
    if obj.metric != "downstream":
        return
    tasks = obj.tasks if obj.tasks is not None else spec.eval.tasks
    if not tasks:
        raise SpecError("a downstream objective needs tasks: give objective.tasks or base.eval.tasks",
                        file=tune.file, key="objective.tasks")
    missing = [t for t in tasks if t not in spec.eval.tasks]
    if missing:
        raise SpecError("objective task is not evaluated by the runs (add it to base.eval.tasks)", file=tune.file,
                        key="objective.tasks", value=missing[0], allowed=", ".join(spec.eval.tasks) or "(none)")
    if obj.name:
        from ablate.evaluate.tasks import load_task

        lacking = [t for t in tasks if obj.name not in load_task(t).metrics]
        if lacking:
            provided = sorted({m for t in tasks for m in load_task(t).metrics})
            raise SpecError(f"objective metric is not provided by task(s) {', '.join(lacking)}", file=tune.file,
                            key="objective.name", value=obj.name, allowed=", ".join(provided))


def _named(raw: str | dict, what: str, names: tuple[str, ...], file) -> tuple[str, dict]:
    if isinstance(raw, str):
        name, opts = raw, {}
    else:
        opts = dict(raw)
        name = opts.pop("name", None)
    if name not in names:
        raise SpecError(f"unknown {what}", file=file, key=f"{what}.name" if isinstance(raw, dict) else what,
                        value=name, allowed=", ".join(names))
    return name, opts


def _check_sampler(tune: Tune) -> None:
    name, opts = _named(tune.spec.sampler, "sampler", SAMPLERS, tune.file)
    if name == "grid":
        for p in tune.params.values():
            if p.kind == "float":
                raise SpecError("the grid sampler needs categorical or int parameters", file=tune.file,
                                key=f"search_space.{p.key}", allowed="choices: [...] or type: int")
    if name == "cmaes":
        try:
            import cmaes  # noqa: F401
        except ImportError:
            raise SpecError("the cmaes sampler needs the `cmaes` package (pip install cmaes)", file=tune.file,
                            key="sampler", value=name, allowed="tpe, random, grid") from None
    make_sampler(tune)


def make_sampler(tune: Tune, n_existing: int = 0):
    """The sampler; a seed is offset by the trials already in the study, so a resumed seeded study does
    not propose its first points again."""
    import optuna

    name, opts = _named(tune.spec.sampler, "sampler", SAMPLERS, tune.file)
    if isinstance(opts.get("seed"), int) and n_existing:
        opts["seed"] += n_existing
    try:
        if name == "tpe":
            return optuna.samplers.TPESampler(**opts)
        if name == "random":
            return optuna.samplers.RandomSampler(**opts)
        if name == "cmaes":
            return optuna.samplers.CmaEsSampler(**opts)
        space = {}
        for p in tune.params.values():
            space[p.key] = list(p.choices) if p.kind == "categorical" else list(range(p.low, p.high + 1, p.step or 1))
        return optuna.samplers.GridSampler(space, **opts)
    except TypeError as exc:
        raise SpecError(f"bad sampler option: {exc}", file=tune.file, key="sampler") from None


def _check_pruner(tune: Tune) -> None:
    make_pruner(tune)


def make_pruner(tune: Tune):
    import optuna

    name, opts = _named(tune.spec.pruner, "pruner", PRUNERS, tune.file)
    cls = {"none": optuna.pruners.NopPruner, "median": optuna.pruners.MedianPruner,
           "successive_halving": optuna.pruners.SuccessiveHalvingPruner,
           "threshold": optuna.pruners.ThresholdPruner}[name]
    try:
        return cls(**opts)
    except (TypeError, ValueError) as exc:
        raise SpecError(f"bad pruner option: {exc}", file=tune.file, key="pruner") from None


# ------------------------------------------------------------------ trial -> run

def _as_list(value: Any) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def trial_run(tune: Tune, params: dict[str, Any], trial: int | None) -> PlannedRun:
    """The run a trial's parameters describe: a one-point grid, expanded (same checks, same run id)."""
    spec, file = tune.spec, tune.file
    schedule = params.get("schedule", next(iter(spec.schedules)))
    mask_name = params.get("freeze", "none" if "none" in spec.freeze_masks else next(iter(spec.freeze_masks)))
    base = copy.deepcopy(spec.base)
    prelude = [copy.deepcopy(dict(p)) for p in spec.prelude]
    phases = [copy.deepcopy(dict(p)) for p in spec.schedules[schedule]]
    by_name = {p.get("name"): p for p in prelude + phases}
    for key, value in params.items():
        if key in ("schedule", "freeze"):
            continue
        parts = key.split(".")
        if parts[0] == "phases":
            if parts[1] in by_name:  # a phase the chosen schedule lacks: the parameter does nothing here
                set_path(by_name[parts[1]], ".".join(parts[2:]), value, file, f"search_space.{key}")
        elif parts[0] == "freeze_layers":
            p = by_name.get(parts[1])
            if p is not None:
                groups = [str(g) for g in _as_list(p.get("freeze", ["none"])) if str(g) != "none"]
                if isinstance(value, int) and not isinstance(value, bool):
                    if value >= 0:
                        groups.append(f"0-{value}")
                elif value is not None and str(value) != "none":
                    groups.append(str(value))
                p["freeze"] = groups or ["none"]
        elif parts[0] == "share":
            a, b = by_name.get(parts[1]), by_name.get(parts[2])
            if a is not None and b is not None:
                fa, fb = a.get("fraction"), b.get("fraction")
                if not isinstance(fa, (int, float)) or not isinstance(fb, (int, float)):
                    raise SpecError("share.A.B needs both phases' lengths given as fraction", file=file,
                                    key=f"search_space.{key}", value=key)
                total = fa + fb
                a["fraction"] = round(value * total, 12)
                b["fraction"] = round(total - a["fraction"], 12)
        else:
            set_path(base, key, value, file, f"search_space.{key}")
    present = {p.get("name") for p in prelude + phases}
    mask = {k: v for k, v in spec.freeze_masks.get(mask_name, {}).items() if k in present}
    try:
        grid = GridSpec(sweep=spec.study, base=base, prelude=tuple(prelude), schedules={schedule: tuple(phases)},
                        freeze_masks={mask_name: mask}, axes={"schedule": (schedule,), "freeze": (mask_name,)},
                        launcher=spec.launcher)
    except ValidationError as exc:
        raise spec_error_from(exc, file) from None
    run = expand(grid, file=file)[0]
    axes = {**run.axes, **{k: v for k, v in params.items() if k not in ("schedule", "freeze")}}
    if trial is not None:
        axes["trial"] = trial
    labels = {"sweep": spec.study, "axes": axes, "study": spec.study}
    if trial is not None:
        labels["trial"] = trial
    return PlannedRun(run.spec.model_copy(update={"labels": labels}), axes, run.origins)


# ------------------------------------------------------------------ storage

def study_dir(results_root: Path, study: str) -> Path:
    return Path(results_root) / study


def storage_url(storage: str, sdir: Path) -> str:
    """The storage as a string: sqlite:///abs/path, journal:/abs/path, or the RDB URL as given."""
    if storage == "sqlite":
        return f"sqlite:///{(Path(sdir) / 'optuna.db').resolve()}"
    if storage == "journal":
        return f"journal:{(Path(sdir) / 'optuna.journal').resolve()}"
    return storage


def open_storage(url: str):
    """sqlite:///..., any SQLAlchemy URL, journal:PATH or a path ending in .journal."""
    import optuna
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    if url.startswith("journal:") or url.endswith(".journal"):
        path = url.removeprefix("journal:")
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(path))
    if "://" not in url:
        raise SpecError("not a storage URL", key="storage", value=url,
                        allowed="sqlite, journal, journal:PATH, a .journal path, or an RDB URL (sqlite:///..., "
                                "postgresql://..., mysql://...)")
    try:
        return optuna.storages.RDBStorage(url)
    except Exception as exc:  # bad driver / unreachable database
        raise SpecError(f"cannot open storage: {type(exc).__name__}: {exc}", key="storage", value=url) from None


# ------------------------------------------------------------------ objective

def objective_value(tune: Tune, spec: RunSpec, run_dir: Path) -> float:
    obj = tune.spec.objective
    if obj.metric == "loss":
        curves = rundir.read_json(run_dir / "records" / "curves.json")
        final = spec.phases[-1].name
        losses = [l for ph, l in zip(curves["phase"], curves["loss"]) if ph == final]
        if not losses:
            raise ValueError(f"no training loss logged for the final phase {final!r}")
        tail = losses[-obj.last_n:]
        return float(sum(tail) / len(tail))
    tasks = obj.tasks if obj.tasks is not None else spec.eval.tasks
    rows = rundir.read_scores(run_dir, run_dir.name)
    values = []
    for task in tasks:
        from ablate.evaluate.tasks import load_task

        name = obj.name or load_task(task).primary_metric
        values += [r["value"] for r in rows if r.get("task") == task and r.get("split") == obj.split
                   and r.get("metric") == name and r.get("value") is not None]
    if not values:
        raise ValueError(f"no {obj.split} scores for the objective in {run_dir}")
    return float(sum(values) / len(values))


def _logged_losses(run_dir: Path, spec: RunSpec) -> dict[int, float]:
    """The training loss at each step the worker logs (every log_every steps and each phase's end)."""
    try:
        curves = rundir.read_json(run_dir / "records" / "curves.json")
    except (OSError, ValueError):
        return {}
    steps, phases, losses = curves.get("step", []), curves.get("phase", []), curves.get("loss", [])
    out = {}
    for i, (step, loss) in enumerate(zip(steps, losses)):
        phase_end = i + 1 == len(steps) or phases[i + 1] != phases[i]
        if step % spec.log_every == 0 or phase_end:
            out[int(step)] = float(loss)
    return out


# ------------------------------------------------------------------ running a study

class TuneJob:
    """A run folder's job, optionally for only the next `stop_after_steps` steps (the debug executor runs
    in-process, so it advances trials a report interval at a time)."""

    def __init__(self, stop_after_steps: int | None = None):
        self.stop_after_steps = stop_after_steps

    def __call__(self, run_dir: str) -> str:
        from ablate.launch import worker

        try:
            return worker.execute(Path(run_dir), stop_after_steps=self.stop_after_steps)
        except worker.AlreadyRunning as exc:
            print(exc, file=sys.stderr)
            return "already-running"


@dataclass
class Active:
    trial: Any                    # optuna.Trial
    run: PlannedRun
    run_dir: Path
    job: Any = None
    reported: set = field(default_factory=set)


def _trial_record(run_dir: Path, trial: int, state: str, value, params: dict, **extra) -> None:
    path = run_dir / "tune.json"
    try:
        old = rundir.read_json(path)
    except (OSError, ValueError):
        old = {}
    trials = sorted(set(old.get("trials", [])) | {trial})
    atomic.write_json(path, {"trial": trial, "state": state, "value": value, "params": params, "trials": trials,
                             "updated": time.time(), **extra})


class StudyLock:
    """One `ablate tune` process per study folder: RUNNING trials found at start were left by a dead one."""

    def __init__(self, sdir: Path):
        self.lock = FileLock(Path(sdir) / ".tune.lock")

    def __enter__(self):
        if not self.lock.acquire(wait_s=0):
            raise SpecError("another `ablate tune` is running this study", key="study",
                            value=self.lock.path.parent.name)
        return self

    def __exit__(self, *exc):
        self.lock.release()


def run_tune(tune: Tune, results_root: Path, executor: str | None = None, out: Print = print,
             poll_s: float = 2.0) -> dict[str, int]:
    """Ask, run, report, prune, tell, until the study holds n_trials finished trials. Returns counts by state."""
    import optuna
    from optuna.trial import TrialState

    from ablate.launch import scheduler as launch

    from ablate.launch import worker

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec = tune.spec
    kind = executor or spec.launcher.executor
    sdir = study_dir(results_root, spec.study)
    sdir.mkdir(parents=True, exist_ok=True)
    url = storage_url(spec.storage, sdir)
    with StudyLock(sdir):
        storage = open_storage(url)
        try:
            n_existing = len(optuna.load_study(study_name=spec.study, storage=storage).trials)
        except KeyError:
            n_existing = 0
        study = optuna.create_study(study_name=spec.study, storage=storage, load_if_exists=True,
                                    direction=spec.effective_direction, sampler=make_sampler(tune, n_existing),
                                    pruner=make_pruner(tune))
        if study.direction.name.lower() != spec.effective_direction:
            raise SpecError(f"study {spec.study!r} exists with direction {study.direction.name.lower()}",
                            file=tune.file, key="direction", value=spec.effective_direction)
        if tune.file:
            atomic.write_text(sdir / "tune.yaml", Path(tune.file).read_text())
        atomic.write_json(sdir / "study.json", {"study": spec.study, "storage": url, "tune_file":
                                                str(Path(tune.file).resolve()) if tune.file else None,
                                                "updated": time.time()})
        distributions = {k: p.distribution() for k, p in tune.params.items()}
        trials = study.get_trials(deepcopy=False)
        finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)]
        stale = [t for t in trials if t.state == TrialState.RUNNING]
        if not trials:
            for fixed in spec.enqueue:
                study.enqueue_trial(fixed)
        to_ask = max(0, spec.n_trials - len(finished) - len(stale))
        out(f"study {spec.study}: {len(finished)} finished trials, {len(stale)} left running by an earlier "
            f"process (resumed), {to_ask} to ask; storage {url}; executor {kind}")
        ex = launch.make_executor(kind, _grid_for_executor(tune), sdir / "jobs")
        active: dict[str, Active] = {}      # run_id -> the trial running it
        queue: list = [optuna.trial.Trial(study, t._trial_id) for t in stale]
        run_ids: list[str] = []
        manifest = sdir / "sweep.json"
        if manifest.is_file():
            run_ids = list(rundir.read_json(manifest).get("run_ids", []))
        counts = {"complete": 0, "pruned": 0, "fail": 0}
        pruned_chunked = kind == "debug" and not isinstance(make_pruner(tune), optuna.pruners.NopPruner)

        def tell(a: Active, state, value=None, note: str = "") -> None:
            n = a.trial.number
            if state == TrialState.COMPLETE:
                study.tell(a.trial, value)
                _trial_record(a.run_dir, n, "complete", value, a.trial.params)
                counts["complete"] += 1
            elif state == TrialState.PRUNED:
                study.tell(a.trial, state=TrialState.PRUNED)
                _trial_record(a.run_dir, n, "pruned", None, a.trial.params, note=note)
                counts["pruned"] += 1
            else:
                study.tell(a.trial, state=TrialState.FAIL)
                _trial_record(a.run_dir, n, "fail", None, a.trial.params, note=note)
                counts["fail"] += 1
            out(f"trial {n} ({a.run.run_id}): {state.name.lower()}" + (f" value {value:.6g}" if value is not None
                                                                           else "") + (f" - {note}" if note else ""))

        def report(a: Active, losses: dict[int, float]) -> bool:
            """Report new intermediate values; True when the pruner says stop."""
            for step in sorted(losses):
                if step in a.reported:
                    continue
                a.trial.report(losses[step], step)
                a.reported.add(step)
                if a.trial.should_prune():
                    return True
            return False

        def finish_from_folder(a: Active) -> bool:
            """Resolve a trial whose run needs no job (done, or failed/pruned before); False: it needs one."""
            status = rundir.read_status(a.run_dir)
            state = rundir.effective_state(a.run_dir, status)
            if state == "done":
                report(a, _logged_losses(a.run_dir, a.run.spec))
                try:
                    tell(a, TrialState.COMPLETE, objective_value(tune, a.run.spec, a.run_dir))
                except (OSError, ValueError, KeyError) as exc:
                    tell(a, TrialState.FAIL, note=f"no objective value: {exc}")
                return True
            if state == "failed":
                error = (status.get("error") or "").strip()
                pruned = error.startswith(PRUNED_PREFIX)
                tell(a, TrialState.PRUNED if pruned else TrialState.FAIL,
                     note=("run was " + error) if pruned else "run failed before: " + (error.splitlines() or [""])[-1])
                return True
            return False

        def submit(a: Active) -> None:
            job_fn = TuneJob(a.run.spec.log_every) if pruned_chunked else launch.RunJob()
            a.job = ex.submit(job_fn, str(a.run_dir))
            rundir.write_status(a.run_dir, "submitted", job_id=str(a.job.job_id), executor=kind,
                                 job_stdout=str(a.job.paths.stdout), job_stderr=str(a.job.paths.stderr))

        def start(trial) -> None:
            run = trial_run(tune, trial.params, trial.number)
            run_dir = sdir / "runs" / run.run_id
            worker.prepare_run_dir(run.spec, run_dir)
            if run.run_id not in run_ids:
                run_ids.append(run.run_id)
                atomic.write_json(manifest, {"sweep": spec.study, "grid_file": tune.file, "run_ids": run_ids,
                                             "updated": time.time(), "tune": True})
            a = Active(trial, run, run_dir)
            if run.run_id in active:        # the same run already in flight: wait for it
                waiting_runs.append(a)
                return
            if finish_from_folder(a):
                return
            if launch.classify(run_dir, retry_failed=False) == "skip-active":
                waiting_runs.append(a)      # running under another sweep or study: wait for its folder
                return
            out(f"trial {trial.number}: run {run.run_id} " + ", ".join(f"{k}={v}" for k, v in trial.params.items()))
            submit(a)
            active[run.run_id] = a

        def prune(a: Active, step: int) -> None:
            if a.job is not None and not a.job.done():
                a.job.cancel()
                deadline = time.time() + 60
                while kind != "debug" and not a.job.done() and time.time() < deadline:
                    time.sleep(0.2)
            rundir.write_status(a.run_dir, "failed", error=f"{PRUNED_PREFIX} at step {step}")
            tell(a, TrialState.PRUNED, note=f"at step {step}")

        waiting_runs: list[Active] = []
        try:
            while queue or to_ask or active or waiting_runs:
                while len(active) + len(waiting_runs) < spec.parallel and (queue or to_ask):
                    if queue:
                        start(queue.pop(0))
                    else:
                        to_ask -= 1
                        start(study.ask(distributions))
                for rid, a in list(active.items()):
                    if kind == "debug":
                        try:
                            a.job.result()
                        except Exception:  # recorded in the run's status by the worker
                            pass
                        losses = _logged_losses(a.run_dir, a.run.spec) or _progress_loss(a.run_dir)
                    else:
                        losses = _progress_loss(a.run_dir)
                    state = rundir.effective_state(a.run_dir)
                    if state != "done" and report(a, losses):
                        prune(a, max(a.reported))
                        del active[rid]
                        continue
                    if not a.job.done():
                        continue
                    if kind == "debug" and state in ("interrupted", "pending", "submitted"):
                        submit(a)           # the next report interval
                        continue
                    launch._record_job_failure(a.run_dir, a.job)
                    if not finish_from_folder(a):
                        tell(a, TrialState.FAIL, note=f"run ended {state}")
                    del active[rid]
                for a in list(waiting_runs):
                    if a.run.run_id not in active and not rundir.RunLock(a.run_dir).held_elsewhere():
                        waiting_runs.remove(a)
                        if not finish_from_folder(a):
                            submit(a)
                            active[a.run.run_id] = a
                if (active and kind != "debug") or (waiting_runs and not active):
                    time.sleep(poll_s)
        finally:
            write_trials_table(study, sdir)
    return counts


def _progress_loss(run_dir: Path) -> dict[int, float]:
    try:
        p = rundir.read_json(run_dir / "progress.json")
        return {int(p["step"]): float(p["loss"])}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _grid_for_executor(tune: Tune) -> GridSpec:
    return GridSpec(sweep=tune.spec.study, base={}, schedules={"_": ()}, launcher=tune.spec.launcher)


def write_trials_table(study, sdir: Path) -> None:
    """results/<study>/trials.csv (+ .parquet): one row per trial, its state, value and params."""
    frame = study.trials_dataframe()
    if frame.empty:
        return
    frame.insert(0, "study", study.study_name)
    run_of = {}
    for run_dir in (Path(sdir) / "runs").glob("*/tune.json"):
        try:
            for n in rundir.read_json(run_dir).get("trials", []):
                run_of[n] = run_dir.parent.name
        except (OSError, ValueError):
            pass
    frame.insert(1, "run_id", frame["number"].map(run_of))
    tables.write_tables(sdir, {"trials": frame})


# ------------------------------------------------------------------ dashboard

def resolve_storage(study: str | None, storage: str | None, results: str | None) -> tuple[str, str | None]:
    """(storage url, study name) for the dashboard / the tune figure."""
    from ablate.config.paths import results_root

    if storage:
        if storage in ("sqlite", "journal"):
            if not study:
                raise SpecError(f"--storage {storage} needs a study name", key="STUDY")
            return storage_url(storage, study_dir(results_root(results), study)), study
        return storage, study
    root = results_root(results)
    if study:
        sdir = Path(study) if (Path(study) / "study.json").is_file() else study_dir(root, study)
        if not (sdir / "study.json").is_file():
            raise SpecError("no such study (no study.json)", key="STUDY", value=study,
                            allowed=", ".join(sorted(p.parent.name for p in root.glob("*/study.json"))) or "(none yet)")
        info = rundir.read_json(sdir / "study.json")
        return info["storage"], info["study"]
    found = sorted(root.glob("*/study.json"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise SpecError(f"no study under {root}; give STUDY or --storage", key="STUDY")
    info = rundir.read_json(found[-1])
    return info["storage"], info["study"]


def serve_dashboard(url: str, host: str = "127.0.0.1", port: int = 8080, out: Print = print) -> int:
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    import optuna_dashboard

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args):
            pass

    storage = open_storage(url)
    app = optuna_dashboard.wsgi(storage)
    server = make_server(host, port, app, handler_class=Quiet)
    shown = f"[{host}]" if ":" in host else host
    out(f"optuna-dashboard on {url}")
    out(f"open http://{shown}:{server.server_port}/dashboard/  (Ctrl-C to stop)")
    sys.stdout.flush()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


# ------------------------------------------------------------------ figure

def load_study(sweep_dir: Path, study: str = "", storage: str = ""):
    """The study behind a tune's folder (its study.json), or the one named in `storage`."""
    import optuna

    if storage:
        url = storage_url(storage, Path(sweep_dir)) if storage in ("sqlite", "journal") else storage
        name = study or None
    else:
        info_file = Path(sweep_dir) / "study.json"
        if not info_file.is_file():
            raise SpecError("this folder holds no Optuna study (no study.json): run `ablate tune` first, or give "
                            "--set storage=URL", file=str(sweep_dir), key="study.json")
        info = rundir.read_json(info_file)
        url, name = info["storage"], study or info["study"]
    names = optuna.get_all_study_names(open_storage(url))
    name = name or (names[0] if len(names) == 1 else None)
    if name not in names:
        raise SpecError("no such study in the storage", key="study", value=name, allowed=", ".join(names))
    return optuna.load_study(study_name=name, storage=open_storage(url))


def tune_figure(sweep, *, study: str = "", storage: str = ""):
    """Optimisation history (each trial's value, pruned trials at their last reported value, the best so
    far) and parameter importances (fANOVA over complete trials), from the study behind a tune's folder."""
    import pandas as pd
    from matplotlib.figure import Figure
    from optuna.trial import TrialState

    st = load_study(Path(sweep.path), study, storage)
    maximize = st.direction.name == "MAXIMIZE"
    rows, best = [], None
    for t in st.get_trials(deepcopy=False):
        if t.state == TrialState.COMPLETE:
            value = t.value
            best = value if best is None else (max(best, value) if maximize else min(best, value))
        elif t.state == TrialState.PRUNED and t.intermediate_values:
            value = t.intermediate_values[max(t.intermediate_values)]
        else:
            value = None
        rows.append({"part": "history", "trial": t.number, "state": t.state.name.lower(), "value": value,
                     "best_so_far": best, "param": None, "importance": None})
    complete = [t for t in st.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    importances: dict[str, float] = {}
    note = ""
    if len(complete) >= 2:
        try:
            from optuna.importance import get_param_importances

            importances = get_param_importances(st)
        except (RuntimeError, ValueError) as exc:
            note = str(exc)
    else:
        note = "needs at least 2 complete trials"
    for param, imp in importances.items():
        rows.append({"part": "importance", "trial": None, "state": None, "value": None, "best_so_far": None,
                     "param": param, "importance": imp})
    data = pd.DataFrame(rows, columns=["part", "trial", "state", "value", "best_so_far", "param", "importance"])

    fig = Figure(figsize=(10, 3.8), layout="constrained")
    ax, ax2 = fig.subplots(1, 2, width_ratios=[1.3, 1])
    hist = data[data["part"] == "history"]
    markers = {"complete": ("o", "tab:blue"), "pruned": ("x", "tab:orange"), "fail": ("s", "tab:red")}
    for state, (marker, color) in markers.items():
        d = hist[(hist["state"] == state) & hist["value"].notna()]
        if not d.empty:
            ax.scatter(d["trial"], d["value"], marker=marker, color=color, label=state, zorder=3)
    b = hist[hist["best_so_far"].notna()]
    if not b.empty:
        ax.step(b["trial"], b["best_so_far"], where="post", color="black", lw=1, label="best so far")
    ax.set_xlabel("trial")
    ax.set_ylabel(f"objective ({st.direction.name.lower()})")
    ax.set_title(f"optimisation history: {st.study_name}")
    ax.legend(fontsize=8)
    imp = data[data["part"] == "importance"].iloc[::-1]
    if not imp.empty:
        ax2.barh(imp["param"], imp["importance"], color="tab:blue")
        ax2.set_xlabel("importance (fANOVA)")
    else:
        ax2.text(0.5, 0.5, f"no importances: {note}", ha="center", va="center", transform=ax2.transAxes, fontsize=9)
        ax2.set_axis_off()
    ax2.set_title("parameter importances")
    return fig, data


# ------------------------------------------------------------------ commands

def cmd_tune(args) -> int:
    from ablate.launch import scheduler as launch
    from ablate.store import tables
    from ablate.config.paths import results_root

    tune = load_tune(args.tune, storage=args.storage)
    executor = args.executor or tune.spec.launcher.executor
    if executor == "slurm" and not launch.have_slurm():
        raise SpecError("Slurm is not available here (no sbatch on PATH)", key="launcher.executor", value="slurm",
                        allowed="local, debug")
    if args.dry_run:
        print(f"study {tune.study}: {len(tune.params)} parameters ({', '.join(tune.params)}); "
              f"{tune.spec.n_trials} trials, {tune.spec.parallel} in flight; executor {executor}; "
              f"storage {storage_url(tune.spec.storage, study_dir(results_root(args.results), tune.study))}; "
              "dry run: nothing submitted")
        return 0
    root = results_root(args.results)
    counts = run_tune(tune, root, executor, poll_s=args.poll)
    collected = tables.collect(study_dir(root, tune.study))
    for problem in collected.problems:
        print(f"warning: {problem}", file=sys.stderr)
    print(f"summary: {counts['complete']} complete, {counts['pruned']} pruned, {counts['fail']} failed this time; "
          f"tables in {study_dir(root, tune.study)} (runs, scores, curves, ..., trials)")
    return 1 if counts["fail"] else 0


def cmd_dashboard(args) -> int:
    url, _ = resolve_storage(args.study, args.storage, args.results)
    return serve_dashboard(url, args.host, args.port)


def add_commands(subparsers) -> None:
    """Register `tune` and `dashboard` on the CLI's subparsers."""
    t = subparsers.add_parser("tune", help="run an Optuna study whose trials are runs (resumes when re-run)")
    t.add_argument("tune", help="tune file (YAML)")
    t.add_argument("--executor", choices=["local", "slurm", "debug"])
    t.add_argument("--storage", help="sqlite (default), journal, or an RDB URL; overrides the file's storage")
    t.add_argument("--results", help="results root (default: $ABLATE_RESULTS or ./results)")
    t.add_argument("--poll", type=float, default=2.0, help="seconds between progress checks")
    t.add_argument("--dry-run", action="store_true", help="check the file, submit nothing")
    t.set_defaults(func=cmd_tune)

    d = subparsers.add_parser("dashboard", help="serve optuna-dashboard on a study's storage")
    d.add_argument("study", nargs="?", help="study name or folder (default: the most recent)")
    d.add_argument("--storage", help="storage URL (sqlite:///..., journal:PATH, *.journal, RDB URL)")
    d.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    d.add_argument("--port", type=int, default=8080, help="port (0: any free port)")
    d.add_argument("--results")
    d.set_defaults(func=cmd_dashboard)


def main_for_tests(argv: list[str] | None = None) -> int:
    """The `ablate` command itself (tune and dashboard are two of its subcommands)."""
    from ablate.cli import main

    return main(argv)


if __name__ == "__main__":
    sys.exit(main_for_tests())
