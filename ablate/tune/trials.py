"""A trial and its run: the run a trial's parameters describe (a one-point grid, so the same checks, run id
and folder as a sweep's run), what the run's records give the study (the losses at its log steps, the
objective value), and the run folder's tune.json, which says which study, storage and trial the run
belongs to.

Run ids are content hashes: a trial whose parameters give a run that is already done reuses its result.

May import: config, store, plan, evaluate, tune.schema.
"""

from __future__ import annotations

import copy
import os
import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ablate.config.base import spec_error_from
from ablate.config.errors import SpecError
from ablate.config.grid import GridSpec
from ablate.config.spec import RunSpec
from ablate.plan.grid import PlannedRun, expand, set_path
from ablate.store import atomic, rundir
from ablate.tune.schema import Tune

TRIAL_RECORD = "tune.json"


class CorruptRecord(ValueError):
    """A record a run folder should hold that is missing or cannot be read as what it should be; the
    message says which file and what is wrong with it."""


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
                    raise SpecError(
                        "share.A.B needs both phases' lengths given as fraction",
                        file=file,
                        key=f"search_space.{key}",
                        value=key,
                    )
                total = fa + fb
                a["fraction"] = round(value * total, 12)
                b["fraction"] = round(total - a["fraction"], 12)
        else:
            set_path(base, key, value, file, f"search_space.{key}")
    present = {p.get("name") for p in prelude + phases}
    mask = {k: v for k, v in spec.freeze_masks.get(mask_name, {}).items() if k in present}
    try:
        grid = GridSpec(
            sweep=spec.study,
            base=base,
            prelude=tuple(prelude),
            schedules={schedule: tuple(phases)},
            freeze_masks={mask_name: mask},
            axes={"schedule": (schedule,), "freeze": (mask_name,)},
            launcher=spec.launcher,
        )
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


# ------------------------------------------------------------------ what the run's records give the study


def read_curves(run_dir: Path) -> dict[str, list]:
    """records/curves.json of a finished run: equally long phase, step and loss columns (CorruptRecord
    otherwise: a finished run without readable losses has nothing to give its trial)."""
    path = Path(run_dir) / "records" / "curves.json"
    try:
        curves = rundir.read_json(path)
    except (OSError, ValueError) as exc:
        raise CorruptRecord(f"{path}: unreadable ({type(exc).__name__}: {exc})") from None
    columns = ("phase", "step", "loss")
    if (
        not isinstance(curves, dict)
        or not all(isinstance(curves.get(c), list) for c in columns)
        or len({len(curves[c]) for c in columns}) != 1
    ):
        raise CorruptRecord(f"{path}: not a curves record (equally long phase, step and loss columns)")
    return curves


def logged_losses(curves: dict[str, list], log_every: int) -> dict[int, float]:
    """The training loss at each step the run logs (every log_every steps and each phase's end): the
    values the run reports to its trial as it trains."""
    steps, phases, losses = curves["step"], curves["phase"], curves["loss"]
    out = {}
    for i, (step, loss) in enumerate(zip(steps, losses)):
        phase_end = i + 1 == len(steps) or phases[i + 1] != phases[i]
        if step % log_every == 0 or phase_end:
            out[int(step)] = float(loss)
    return out


def objective_value(tune: Tune, spec: RunSpec, run_dir: Path, curves: dict[str, list]) -> float:
    """The trial's value from its finished run: the final phase's mean loss over its last N steps, or the
    mean downstream score (ValueError when the run has none)."""
    obj = tune.spec.objective
    if obj.metric == "loss":
        final = spec.phases[-1].name
        losses = [loss for ph, loss in zip(curves["phase"], curves["loss"]) if ph == final]
        if not losses:
            raise ValueError(f"no training loss logged for the final phase {final!r} in {run_dir}")
        tail = losses[-obj.last_n :]
        return float(sum(tail) / len(tail))
    from ablate.evaluate.tasks import load_task

    tasks = objective_tasks(obj, spec)
    rows = rundir.read_scores(run_dir, run_dir.name)
    values = []
    for task in tasks:
        name = obj.name or load_task(task).primary_metric
        values += [
            r["value"]
            for r in rows
            if r.get("task") == task
            and r.get("split") == obj.split
            and r.get("metric") == name
            and r.get("value") is not None
        ]
    if not values:
        raise ValueError(f"no {obj.split} scores for the objective in {run_dir}")
    return float(sum(values) / len(values))


def objective_tasks(obj, spec: RunSpec, file: str | None = None) -> list[str]:
    """The tasks a downstream objective averages: objective.tasks, else the base's eval.tasks, each
    `suite:NAME` expanded to its tasks (ablate.evaluate.suites)."""
    from ablate.evaluate.suites import eval_items

    named, key = (obj.tasks, "objective.tasks") if obj.tasks is not None else (spec.eval.tasks, "base.eval.tasks")
    return [item.task for item in eval_items(named, spec.eval.seeds, key=key, file=file)]


# ------------------------------------------------------------------ tune.json


def read_trial_record(run_dir: Path) -> dict | None:
    """The run folder's tune.json (None when there is none; CorruptRecord when it cannot be read)."""
    path = Path(run_dir) / TRIAL_RECORD
    try:
        record = rundir.read_json(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise CorruptRecord(f"{path}: unreadable ({type(exc).__name__}: {exc})") from None
    if not isinstance(record, dict) or not isinstance(record.get("trials", []), list):
        raise CorruptRecord(f"{path}: not a trial record (a mapping with a list of trials)")
    missing = [k for k in ("trial", "state") if k not in record]  # write_trial_record writes both, always
    if missing:
        raise CorruptRecord(f"{path}: not a trial record (lacks {', '.join(missing)})")
    for key, kind in (("study", str), ("storage", str), ("trial", int), ("state", str)):
        if key in record and (not isinstance(record[key], kind) or isinstance(record[key], bool)):
            raise CorruptRecord(f"{path}: {key} is {record[key]!r}, not a {kind.__name__}")
    return record


def set_aside(path: Path) -> Path:
    """Rename a corrupt file to <name>.corrupt-<n> (the first n not taken), so nothing is overwritten."""
    n = 1
    while path.with_name(f"{path.name}.corrupt-{n}").exists():
        n += 1
    target = path.with_name(f"{path.name}.corrupt-{n}")
    os.replace(path, target)
    return target


def write_trial_record(run_dir: Path, trial: int, state: str, **fields: Any) -> str | None:
    """Write tune.json: this trial (number, state, fields such as study, storage, params, value), and every
    trial that has used the run. A tune.json that cannot be read is kept as tune.json.corrupt-<n> first;
    the return value then says so (what, where), for the caller to report."""
    path = Path(run_dir) / TRIAL_RECORD
    problem = None
    try:
        old = read_trial_record(run_dir) or {}
    except CorruptRecord as exc:
        kept = set_aside(path)
        problem = f"{exc}; kept as {kept.name}, wrote a fresh {TRIAL_RECORD}"
        old = {}
    trials = sorted({int(n) for n in old.get("trials", []) if isinstance(n, int)} | {trial})
    atomic.write_json(path, {**fields, "trial": trial, "state": state, "trials": trials, "updated": time.time()})
    return problem
