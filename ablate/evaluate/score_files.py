"""The resumable task x seed loop: every (task, fine-tuning seed) of a model is one score file,
<out_dir>/<task>/seed-<seed>.json, written atomically, holding the rows and what they were computed from
(ablate.evaluate.identity: task file, data files, fine-tuning settings).

A score file whose identity matches is read back, not recomputed. One whose identity differs is recomputed,
its old file kept aside in <task>/superseded/; with keep_stale it is kept instead, marked `stale` (with the
reasons) so that the scores table and `ablate status` show it. A stale file whose identity matches again is
unmarked.
A score file that fails its check (read_record: not JSON, rows of the wrong types or of another task or
seed) is never a done unit: it is moved to <task>/superseded/ as seed-<n>.damaged.<time>.json, named in the
log, and the unit computed again.

A suite task whose data the data root lacks is not run: <out_dir>/skipped.json records it (task -> its suite,
the missing paths, how to get them) until a later evaluation scores it, so that a table can call an average
over that suite partial.

A task with `group_by` also gets its metrics per group (ablate.evaluate.groups) of dev and test, at the best
dev epoch: the score file's `groups` rows, which `ablate collect` gathers into the score_groups table.

The units left to compute run one after another in this process, or several at once, each in a process of
its own, where the caller's placement says so (ablate.evaluate.unit_processes); each unit's score file is
written by the process that computed it, and the rows come back in task-then-seed order either way.

May import: config, store, evaluate (tasks, task_readers, protocol, identity, finetune, suites, groups,
unit_processes).
"""

from __future__ import annotations

import functools
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ablate.config.errors import SpecError
from ablate.evaluate import finetune as ft
from ablate.evaluate.groups import group_rows
from ablate.evaluate.identity import changed, score_identity
from ablate.evaluate.suites import EvalItem
from ablate.evaluate.task_readers import read_groups
from ablate.evaluate.tasks import FinetuneSettings, TaskSpec, capped, load_task, load_task_data, resolve_settings
from ablate.evaluate.unit_processes import Placement, run_units
from ablate.store import atomic, rundir

SUPERSEDED = "superseded"
SKIPPED = "skipped.json"  # <out_dir>/skipped.json: the suite tasks left out for want of data


def _quiet(_message: str) -> None:
    pass


def evaluate_scores(
    model_dir,
    tasks: list[str],
    seeds: list[int],
    settings_overrides: dict | None,
    out_dir: Path,
    data_root=None,
    device: str = "cpu",
    protocol: str | None = None,
    keep_stale: bool = False,
    log: Callable[[str], None] = _quiet,
    progress: Callable[[dict], None] | None = None,
) -> list[dict]:
    """Fine-tune `model_dir` on every task x seed whose scores under out_dir are missing or out of date and
    return all their rows (each with `stale`: True for a score kept out of date by keep_stale)."""
    items = [EvalItem(name, tuple(seeds), dict(settings_overrides or {})) for name in tasks]
    return evaluate_items(
        model_dir,
        items,
        out_dir,
        data_root=data_root,
        device=device,
        protocol=protocol,
        keep_stale=keep_stale,
        log=log,
        progress=progress,
    )


def evaluate_items(
    model_dir,
    items: list[EvalItem],
    out_dir: Path,
    data_root=None,
    device: str = "cpu",
    protocol: str | None = None,
    keep_stale: bool = False,
    log: Callable[[str], None] = _quiet,
    progress: Callable[[dict], None] | None = None,
    share: tuple[int, int] = (0, 1),
    place: Callable[[list[str]], Placement] | None = None,
) -> list[dict]:
    """evaluate_scores with seeds and overrides per task (ablate.evaluate.suites.EvalItem). Every task file,
    setting, data file and existing score file is checked before any training starts. Each row carries
    `n_examples`, the examples of its split the score was computed on.

    share (index, count): this process takes only its share of the (task, seed) units, every count-th from
    its index in task-then-seed order, and returns their rows: how the ranks of a data-parallel run split
    its fine-tunings (each unit's score file is the same whichever process computes it).

    place (optional): given the tasks of the units left to compute, where they run and how many at once
    (evaluate.unit_processes.Placement); without it, or when it allows one at a time on one device, they run
    one after another in this process on `device`, as they always did."""
    out_dir = Path(out_dir)
    plan = []
    for item in items:
        task = load_task(item.task)
        settings = ft.resolve_precision(resolve_settings(task, item.finetune, protocol), device)
        data = load_task_data(task, data_root)
        wanted = score_identity(task, settings, data_root)
        sizes = {s: len(capped(data.splits[s], settings.max_eval_examples)) for s in ("dev", "test")}
        groups = read_groups(task, data_root) if task.group_by else {}  # a missing field: before any training
        for seed in item.seeds:
            path = out_dir / task.name / f"seed-{seed}.json"
            unit = Unit(task, settings, seed, path, wanted, sizes, groups)
            plan.append((unit, read_record(path, task.name, seed) if path.exists() else None))
    mine = units_of(plan, share)
    rows_of: dict[Path, list[dict]] = {}
    pending: list[Unit] = []
    for unit, record in mine:
        if isinstance(record, Damaged):
            aside = _set_aside(unit.path, "damaged")
            log(f"{unit.name}: score file {unit.path} is damaged ({record.problem}); kept as {aside}, recomputing")
        elif record is not None:
            reasons = changed(record.get("identity"), unit.wanted)
            if not reasons or keep_stale:
                _mark(unit.path, record, reasons)
                if reasons:
                    log(f"{unit.name}: kept stale scores ({'; '.join(reasons)})")
                rows_of[unit.path] = [{**row, "stale": bool(reasons)} for row in record["rows"]]
                continue
            aside = _set_aside(unit.path)
            log(f"{unit.name}: recomputing ({'; '.join(reasons)}); old scores kept in {aside}")
        pending.append(unit)
    compute = functools.partial(compute_unit, model_dir=model_dir, data_root=data_root)
    placement = place(list(dict.fromkeys(u.task.name for u in pending))) if place and len(pending) > 1 else None
    if placement is None or placement.one_at_a_time(len(pending)):
        computed = [compute(unit, device=device, log=log, progress=progress) for unit in pending]
    else:
        computed = run_units(pending, compute, placement, log, progress)
    for unit, done in zip(pending, computed):
        rows_of[unit.path] = [{**row, "stale": False} for row in done]
    return [row for unit, _ in mine for row in rows_of[unit.path]]


@dataclass(frozen=True)
class Unit:
    """One (task, fine-tuning seed) to compute: its resolved settings, its score file and what the file must
    say it was computed from (`wanted`), the examples of dev and test, the groups of a task with group_by."""

    task: TaskSpec
    settings: FinetuneSettings
    seed: int
    path: Path
    wanted: dict
    sizes: dict
    groups: dict

    @property
    def name(self) -> str:
        return f"{self.task.name} seed {self.seed}"


def compute_unit(
    unit: Unit,
    model_dir,
    data_root=None,
    device: str = "cpu",
    log: Callable[[str], None] = _quiet,
    progress: Callable[[dict], None] | None = None,
) -> list[dict]:
    """Fine-tune one unit and write its score file (atomically); its rows. The same in this process or in
    one of its own (evaluate.unit_processes)."""
    task, settings, seed = unit.task, unit.settings, unit.seed
    predictions: dict[str, tuple[list, list]] = {}

    def keep(split: str, gold: list, preds: list) -> None:
        predictions[split] = (gold, preds)

    done = [
        {**row, "n_examples": unit.sizes.get(row["split"])}
        for row in ft.finetune(
            model_dir,
            task,
            seed,
            settings,
            data_root=data_root,
            device=device,
            log=log,
            progress=progress,
            on_predictions=keep if task.group_by else None,
        )
    ]
    by_group = _group_rows(task, settings, seed, unit.groups, predictions)
    atomic.write_json(
        unit.path,
        {
            "task": task.name,
            "seed": seed,
            "model_dir": str(model_dir),
            "settings": settings.model_dump(mode="json"),
            "identity": unit.wanted,
            "rows": done,
            **({"groups": by_group} if task.group_by else {}),
        },
    )
    return done


def _group_rows(
    task, settings, seed: int, groups: dict[str, list], predictions: dict[str, tuple[list, list]]
) -> list[dict]:
    """The per-group rows of one fine-tuning from its dev and test predictions (in split order); groups: each
    split's examples' group values (task_readers.read_groups)."""
    rows = []
    for split, (gold, preds) in predictions.items():
        values = capped(groups[split], settings.max_eval_examples, settings.subset)
        rows += [
            {"task": task.name, "finetune_seed": seed, **row}
            for row in group_rows(task, split, values, gold, preds)
        ]
    return rows


def units_of(units: list, share: tuple[int, int]) -> list:
    """The units of one share (index, count): every count-th, from index. The shares of 0..count-1 cover
    every unit once."""
    index, count = share
    if not 0 <= index < count:
        raise ValueError(f"share {index} of {count}")
    return units[index::count]


@dataclass(frozen=True)
class Damaged:
    """A score file that fails read_record's check: never a done unit (it is set aside and computed again)."""

    problem: str


def read_record(path: Path, task: str, seed: int) -> dict | Damaged:
    """The score file of (task, seed), checked: a mapping whose rows are each this task's and seed's, with
    split and metric as text and a numeric value (rundir.score_row_problem, as collect checks them), its
    `groups` a list and its `stale` a list when there; Damaged saying what is wrong otherwise."""
    try:
        record = json.loads(Path(path).read_bytes())
    except (OSError, ValueError) as e:  # ValueError: JSON's and UTF-8's decoding errors
        return Damaged(f"{type(e).__name__}: {e}")
    if not isinstance(record, dict) or not isinstance(record.get("rows"), list):
        return Damaged("not a mapping with a list of rows")
    for key in ("groups", "stale"):
        if key in record and not isinstance(record[key], list):
            return Damaged(f"its {key} is {record[key]!r}, not a list")
    for row in record["rows"]:
        if problem := rundir.score_row_problem(row):
            return Damaged(problem)
        if row["task"] != task or row.get("finetune_seed") != seed or type(row.get("finetune_seed")) is not int:
            return Damaged(
                f"a row of task {row['task']!r}, seed {row.get('finetune_seed')!r}, not {task} seed {seed}"
            )
        if row.get("value") is None:
            return Damaged("a row's value is null, not a number")
    return record


def _mark(path: Path, record: dict, reasons: list[str]) -> None:
    """Record in the file whether its scores are stale (and why); rewritten only when that changes."""
    if (record.get("stale") or []) == reasons:
        return
    updated = {k: v for k, v in record.items() if k != "stale"}
    if reasons:
        updated["stale"] = reasons
    atomic.write_json(path, updated)


def _set_aside(path: Path, why: str = "") -> Path:
    """Move an out-of-date (or damaged: why) score file to <task>/superseded/ (never overwritten: lose
    nothing)."""
    aside = path.parent / SUPERSEDED / f"{path.stem}.{why + '.' if why else ''}{time.time_ns()}.json"
    aside.parent.mkdir(parents=True, exist_ok=True)
    os.replace(path, aside)
    return aside


def record_skipped(out_dir: Path, evaluated, skipped) -> dict:
    """Update <out_dir>/skipped.json: the tasks just evaluated leave it, the suite tasks just skipped
    (ablate.evaluate.suites.Skipped) enter it; the file is removed once empty. Returns what it holds."""
    path = Path(out_dir) / SKIPPED
    held = read_skipped(Path(out_dir))
    held = {task: entry for task, entry in held.items() if task not in set(evaluated)}
    held.update({s.task: s.record() for s in skipped})
    if held:
        atomic.write_json(path, {"tasks": held})
    elif path.exists():
        path.unlink()
    return held


def read_skipped(out_dir: Path) -> dict:
    """task -> {task, suite, missing, how} of <out_dir>/skipped.json ({} when there is none)."""
    path = Path(out_dir) / SKIPPED
    if not path.exists():
        return {}
    try:
        held = json.loads(path.read_text(encoding="utf-8"))["tasks"]
        if not isinstance(held, dict):
            raise TypeError("tasks is not a mapping")
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
        raise SpecError(f"unreadable skipped-tasks file ({e}); delete it", file=str(path)) from None
    return held
