"""Task suites: named sets of downstream tasks with their fine-tuning seeds (grids/suites/<name>.yaml, or
$ABLATE_SUITES_DIR), usable wherever a task list is: `eval.tasks: [suite:fr_paper]` in a grid or run spec,
`ablate evaluate --task suite:en_paper`.

A suite file names its tasks, the seeds they are fine-tuned with (one list for all, or per task) and optional
fine-tuning overrides (a smoke suite's CPU budget). What a run's `eval` block means, task by task, is
`eval_items`: plain task names take `eval.seeds`, a suite's tasks take the suite's seeds (`--seeds` on the
command line overrides both); settings resolve as
    task file < protocol profile < the suite's `finetune` < the grid's `eval.finetune` < `--set`.
A run spec keeps `suite:NAME` as written (eval is no training field: run ids do not depend on it); every
consumer expands it here, so a suite edited later is what `ablate evaluate` and the dry run read.

May import: config, evaluate (tasks, access).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from ablate.config.base import Strict, read_yaml, unique_items, validate
from ablate.config.errors import SpecError
from ablate.config.paths import registry_dir, registry_names

PREFIX = "suite:"
SUITES_DIR_ENV = "ABLATE_SUITES_DIR"  # default: grids/suites of this checkout


class SuiteTask(Strict):
    task: str
    seeds: tuple[int, ...] | None = Field(default=None, min_length=1, description="default: the suite's seeds")

    @field_validator("seeds")
    @classmethod
    def _each_seed_once(cls, seeds):
        return seeds if seeds is None else unique_items(seeds, "fine-tuning seed")


class SuiteSpec(Strict):
    name: str
    description: str = ""
    seeds: tuple[int, ...] = Field(min_length=1, description="fine-tuning seeds of every task without its own")
    tasks: tuple[str | SuiteTask, ...] = Field(min_length=1)
    finetune: dict[str, Any] = Field(
        default_factory=dict,
        description="overrides of the tasks' fine-tuning settings, under the grid's eval.finetune",
    )

    @field_validator("seeds")
    @classmethod
    def _each_seed_once(cls, seeds):
        return unique_items(seeds, "fine-tuning seed")

    def entries(self) -> list[SuiteTask]:
        return [SuiteTask(task=t) if isinstance(t, str) else t for t in self.tasks]


@dataclass(frozen=True)
class EvalItem:
    """One task of a run's evaluation: its fine-tuning seeds and overrides, and the suite that named it."""

    task: str
    seeds: tuple[int, ...]
    finetune: dict[str, Any] = field(default_factory=dict)
    suite: str | None = None


def suites_dir() -> Path:
    return registry_dir(SUITES_DIR_ENV, "suites")


def list_suites() -> list[str]:
    return registry_names(suites_dir())


def is_suite(entry: str) -> bool:
    return str(entry).startswith(PREFIX)


def load_suite(name: str, key: str = "eval.tasks", file: str | None = None) -> SuiteSpec:
    """The suite NAME (without the prefix); an unknown one is a SpecError at `key` of `file` listing the
    known suites; a task the suite names that has no task file is a SpecError naming the suite file."""
    from ablate.evaluate.tasks import list_tasks, tasks_dir

    path = suites_dir() / f"{name}.yaml"
    if not name or not path.is_file():
        known = ", ".join(PREFIX + s for s in list_suites()) or f"(no suite files in {suites_dir()})"
        raise SpecError("unknown task suite", file=file, key=key, value=PREFIX + name, allowed=known)
    suite = _read_suite(str(path), path.stat().st_mtime_ns)
    if suite.name != name:
        raise SpecError(
            "a suite's name is its file name", file=str(path), key="name", value=suite.name, allowed=name
        )
    names = [e.task for e in suite.entries()]
    for i, task in enumerate(names):
        if not (tasks_dir() / f"{task}.yaml").is_file():
            raise SpecError(
                "the suite names a task with no task file",
                file=str(path),
                key=f"tasks[{i}]",
                value=task,
                allowed=", ".join(list_tasks()),
            )
        if task in names[:i]:
            raise SpecError("a task listed twice", file=str(path), key=f"tasks[{i}]", value=task)
    return suite


@functools.lru_cache(maxsize=64)
def _read_suite(path: str, _mtime_ns: int) -> SuiteSpec:
    """A suite file read and checked once per version (the dry run and every consumer expand it again)."""
    return validate(SuiteSpec, read_yaml(path), path, "suite file")


def eval_items(
    tasks,
    seeds,
    finetune: dict | None = None,
    *,
    seeds_override=None,
    key: str = "eval.tasks",
    file: str | None = None,
) -> list[EvalItem]:
    """The tasks of an eval block (names and `suite:NAME` entries) as EvalItems in order; `seeds_override`
    (the command line's --seeds) replaces every seed list. A task named twice (directly and by a suite, or
    by two suites) is a SpecError: which seeds and settings it gets would be a guess."""
    if seeds_override:
        try:
            unique_items(seeds_override, "fine-tuning seed")
        except ValueError as exc:
            raise SpecError(str(exc), key="--seeds", value=" ".join(map(str, seeds_override))) from None
    items: list[EvalItem] = []
    where: dict[str, str] = {}
    for entry in tasks:
        if is_suite(entry):
            suite = load_suite(str(entry)[len(PREFIX) :], key=key, file=file)
            named = [(e.task, e.seeds or suite.seeds, suite.finetune, suite.name) for e in suite.entries()]
        else:
            named = [(str(entry), tuple(seeds), {}, None)]
        for task, task_seeds, suite_finetune, suite in named:
            if task in where:
                raise SpecError(
                    f"task {task!r} is named twice (by {where[task]} and by "
                    f"{PREFIX + suite if suite else 'name'})",
                    file=file,
                    key=key,
                    value=entry,
                )
            where[task] = PREFIX + suite if suite else "name"
            items.append(
                EvalItem(task, tuple(seeds_override or task_seeds), {**suite_finetune, **(finetune or {})}, suite)
            )
    return items


def spec_items(
    spec,
    *,
    tasks=None,
    seeds=None,
    overrides: dict | None = None,
    key: str = "eval.tasks",
    file: str | None = None,
    present_only: bool = False,
) -> list[EvalItem]:
    """A RunSpec's evaluation (or the command line's --task / --seeds / --set over it) as EvalItems;
    `present_only`: without the suite tasks whose data the spec's data root lacks (`present_items`)."""
    items = eval_items(
        tuple(tasks or spec.eval.tasks),
        spec.eval.seeds,
        {**spec.eval.finetune, **(overrides or {})},
        seeds_override=seeds,
        key=key,
        file=file,
    )
    return present_items(items, spec.data.data_root, key=key, file=file)[0] if present_only else items


@dataclass(frozen=True)
class Skipped:
    """A suite's task left out because the data root lacks its data: what is missing and how to get it."""

    task: str
    suite: str
    missing: tuple[str, ...]
    how: str

    def record(self) -> dict:
        return {"task": self.task, "suite": PREFIX + self.suite, "missing": list(self.missing), "how": self.how}


def present_items(
    items: list[EvalItem], data_root=None, key: str = "eval.tasks", file: str | None = None
) -> tuple[list[EvalItem], list[Skipped]]:
    """The items whose data the data root holds, and the suite tasks it lacks (skipped: a suite names what it
    can, the rest runs). A task named directly whose data is missing is a SpecError: the grid insists on it."""
    from ablate.evaluate.access import how_to_get, missing_paths
    from ablate.evaluate.tasks import load_task

    present, skipped = [], []
    for item in items:
        try:
            task = load_task(item.task, key=key)
        except SpecError as exc:  # an unknown name: where it is written
            raise SpecError(
                exc.message, file=exc.file or file, key=exc.key, value=exc.value, allowed=exc.allowed
            ) from None
        missing = missing_paths(task, data_root)
        if not missing:
            present.append(item)
        elif item.suite is None:
            raise SpecError(
                f"eval task {item.task!r} is named directly but the data root lacks {', '.join(missing)}",
                file=file,
                key=key,
                value=item.task,
                allowed=f"get its data: {how_to_get(task)}; or name it through a suite, "
                "which skips a task it lacks",
            )
        else:
            skipped.append(Skipped(item.task, item.suite, tuple(missing), how_to_get(task)))
    return present, skipped


def skipped_lines(skipped: list[Skipped]) -> list[str]:
    """The dry run's and `ablate evaluate`'s lines on the suite tasks left out, a line per suite."""
    by_suite: dict[str, list[Skipped]] = {}
    for s in skipped:
        by_suite.setdefault(s.suite, []).append(s)
    lines = []
    for suite, group in by_suite.items():
        lines.append(
            f"{PREFIX}{suite}: {len(group)} task(s) skipped, the data root lacks them (the suite's "
            f"average will be partial): {', '.join(s.task for s in group)}"
        )
        lines += [f"  {s.task}: {s.how}" for s in group]
    return lines


def suite_lines(tasks, key: str = "eval.tasks", file: str | None = None) -> list[str]:
    """One line per suite an eval block names: its tasks and seeds (what the dry run prints)."""
    lines = []
    for entry in dict.fromkeys(tasks):
        if not is_suite(entry):
            continue
        suite = load_suite(str(entry)[len(PREFIX) :], key=key, file=file)
        seeds = {e.task: e.seeds or suite.seeds for e in suite.entries()}
        seed_text = "; ".join(dict.fromkeys(_seed_range(s) for s in seeds.values()))
        lines.append(
            f"{entry}: {len(seeds)} tasks ({', '.join(seeds)}), fine-tuning seeds {seed_text}"
            + ("; settings " + ", ".join(f"{k}={v}" for k, v in suite.finetune.items()) if suite.finetune else "")
        )
    return lines


def _seed_range(seeds: tuple[int, ...]) -> str:
    s = sorted(seeds)
    return f"{s[0]}-{s[-1]}" if len(s) > 2 and s == list(range(s[0], s[-1] + 1)) else ",".join(map(str, s))
