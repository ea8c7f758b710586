"""Downstream evaluation of run folders: the sweep's tasks after pretraining, or later, on finished runs
(`ablate evaluate`), and of a base model as the "no continued pretraining" reference.

Scores live in <run folder>/scores/<task>/seed-<n>.json; a (run, task, seed) already there is read back
while its task file, data and fine-tuning settings are unchanged, and recomputed (or kept and marked stale)
when they changed (ablate.evaluate.score_files). A suite's task whose data the data root lacks is skipped, said
and recorded in <scores>/skipped.json; a task named directly without its data is exit 2 (a grid insists).
The fine-tuning protocol is the caller's, else the run's `eval.protocol`, else the task files' own settings
(ablate.evaluate.protocol). What `ablate evaluate` is asked (tasks, seeds, `--set` values and whether any task
reads them, data) is checked for the base model and every finished run (`check_request`) before anything is
written: a bad request leaves the results root as it was.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

from ablate.store import rundir
from ablate.evaluate.score_files import evaluate_items, record_skipped
from ablate.evaluate.suites import EvalItem, eval_items, present_items, skipped_lines, spec_items
from ablate.evaluate.unit_processes import Placement
from ablate.config.device import pick_device
from ablate.config.spec import RunSpec
from ablate.models.loading import check_run_model


def evaluate_run(
    run_dir: Path,
    spec: RunSpec,
    log: Callable[[str], None] = print,
    tasks: tuple[str, ...] | None = None,
    seeds: tuple[int, ...] | None = None,
    overrides: dict | None = None,
    protocol: str | None = None,
    keep_stale: bool = False,
    progress: Callable[[dict], None] | None = None,
    share: tuple[int, int] = (0, 1),
    device: str | None = None,
    place: Callable[[list[str]], Placement] | None = None,
) -> list[dict]:
    """Fine-tune a run folder's model on `tasks` (task names and `suite:NAME`s; default the spec's
    eval.tasks) with `seeds` (default each task's: eval.seeds, or its suite's). `share`: this process's
    share of the (task, seed) units (evaluate.score_files.evaluate_items; the rows returned are its share's);
    `device`: default the spec's; `place`: where the units left to compute run and how many at once
    (launch.shares; default one after another here)."""
    check_run_model(Path(run_dir) / "model")  # a damaged model: exit 2 naming it, before anything is written
    key = "--task" if tasks else "eval.tasks"
    items, skipped = present_items(
        spec_items(spec, tasks=tasks, seeds=seeds, overrides=overrides, key=key), spec.data.data_root, key=key
    )
    for line in skipped_lines(skipped):
        log(line)
    record_skipped(Path(run_dir) / "scores", [i.task for i in items], skipped)
    protocol = protocol or spec.eval.protocol
    log(
        f"evaluating on {_described(items)}"
        + (f", protocol {protocol}" if protocol else "")
        + (f", share {share[0] + 1} of {share[1]} of the fine-tunings" if share[1] > 1 else "")
    )
    rows = evaluate_items(
        str(Path(run_dir) / "model"),
        items,
        Path(run_dir) / "scores",
        data_root=spec.data.data_root,
        device=device or str(pick_device(spec.device)),
        protocol=protocol,
        keep_stale=keep_stale,
        log=log,
        progress=progress,
        share=share,
        place=place,
    )
    for row in rows:
        if row["split"] == "test":
            log(
                f"  {row['task']} seed {row['finetune_seed']}: test {row['metric']} = {row['value']:.4f}"
                + ("  (stale)" if row["stale"] else "")
            )
    return rows


def _described(items: list[EvalItem]) -> str:
    """'ncbi_disease, chemprot (fine-tuning seeds 0, 1); ...': the tasks grouped by their seeds."""
    groups: dict[tuple[int, ...], list[str]] = {}
    for item in items:
        groups.setdefault(item.seeds, []).append(item.task)
    return "; ".join(
        f"{', '.join(names)} (fine-tuning seeds {', '.join(map(str, seeds))})" for seeds, names in groups.items()
    )


def evaluate_sweep(
    sweep_dir: Path,
    tasks: tuple[str, ...],
    seeds: tuple[int, ...] | None,
    overrides: dict | None,
    log: Callable[[str], None] = print,
    protocol: str | None = None,
    keep_stale: bool = False,
    place_for: Callable[[RunSpec], Callable[[list[str]], Placement]] | None = None,
) -> dict[str, int]:
    """Add tasks/seeds to every finished run of a sweep; returns counts of runs evaluated and skipped.
    `place_for(spec)`: where a run's units run and how many at once (launch.shares.run_placer; default one
    after another here)."""
    finished = _finished_runs(sweep_dir)
    counts = {"evaluated": 0, "not done": len(_with_spec(sweep_dir)) - len(finished)}
    _check_runs(finished, tasks, seeds, overrides, protocol)
    for run_dir, spec in finished:
        evaluate_run(
            run_dir,
            spec,
            log=lambda m, r=run_dir.name: log(f"[{r}] {m}"),
            tasks=tasks,
            seeds=seeds,
            overrides=overrides,
            protocol=protocol,
            keep_stale=keep_stale,
            place=place_for(spec) if place_for else None,
        )
        counts["evaluated"] += 1
    return counts


def _with_spec(sweep_dir: Path) -> list[Path]:
    runs = rundir.runs_dir(sweep_dir)
    return sorted(d for d in runs.iterdir() if (d / "spec.json").is_file()) if runs.is_dir() else []


def _finished_runs(sweep_dir: Path) -> list[tuple[Path, RunSpec]]:
    """(folder, spec) of each run of the sweep whose status is done, in name order."""
    return [
        (run_dir, rundir.read_spec(run_dir))
        for run_dir in _with_spec(sweep_dir)
        if rundir.read_status(run_dir).get("state") == "done"
    ]


def check_request(
    sweep_dir: Path,
    tasks: tuple[str, ...],
    seeds: tuple[int, ...] | None,
    overrides: dict | None,
    protocol: str | None = None,
    base: bool = False,
    runs: bool = True,
    data_root: str | None = None,
) -> None:
    """Everything `ablate evaluate` is asked, checked before it writes anything (SpecError): for the base model
    (`base`) and each finished run of the sweep (`runs`), every task exists, its data is there (a task named
    directly), its fine-tuning settings with `--set` over them validate, and every `--set` key is read by at
    least one of the tasks, as a grid's `eval.finetune` is (check_overrides_read)."""
    if base:
        items = eval_items(tasks, (0,), overrides, seeds_override=seeds, key="--task")
        _check_items(items, overrides or {}, protocol, data_root)
    if runs:
        _check_runs(_finished_runs(sweep_dir), tasks, seeds, overrides, protocol)


def _check_runs(finished, tasks, seeds, overrides, protocol) -> None:
    seen: set[tuple] = set()
    for run_dir, spec in finished:
        check_run_model(Path(run_dir) / "model")
        key = (repr(sorted(spec.eval.finetune.items())), spec.eval.seeds, spec.eval.protocol, spec.data.data_root)
        if key not in seen:
            seen.add(key)
            items = spec_items(spec, tasks=tasks, seeds=seeds, overrides=overrides, key="--task")
            _check_items(items, overrides or {}, protocol or spec.eval.protocol, spec.data.data_root)


def _check_items(items: list[EvalItem], overrides: dict, protocol: str | None, data_root) -> None:
    from ablate.config.errors import SpecError
    from ablate.evaluate.tasks import load_task, resolve_settings

    items = present_items(items, data_root, key="--task")[0]
    for item in items:
        try:
            resolve_settings(load_task(item.task, key="--task"), item.finetune, protocol)
        except SpecError as exc:
            field = (exc.key or "").removeprefix("finetune.")
            raise SpecError(
                f"task {item.task!r}: {exc.message}",
                file=exc.file,
                key=f"--set {field}" if field in overrides else exc.key,
                value=exc.value,
                allowed=exc.allowed,
            ) from None
    unread = _unread(protocol, items, overrides) if items and overrides else {}
    if unread:
        key, why = next(iter(unread.items()))
        raise SpecError(
            f"no task evaluated reads it: {why}",
            key=f"--set {key}",
            value=overrides[key],
            allowed=f"settings the tasks {', '.join(i.task for i in items)} read",
        )


def base_folder_name(model_source: str) -> str:
    return "base-" + re.sub(r"[^A-Za-z0-9_.-]+", "_", model_source.split(":")[-1].rstrip("/").split("/")[-1])


def evaluate_base(
    sweep_dir: Path,
    model_source: str,
    tasks: tuple[str, ...],
    seeds: tuple[int, ...] | None,
    overrides: dict | None,
    data_root: str | None = None,
    log: Callable[[str], None] = print,
    protocol: str | None = None,
    keep_stale: bool = False,
) -> Path:
    """The base model itself, as the reference: results/<sweep>/base/<name>/scores/... (seeds None: each
    task's suite seeds, else seed 0)."""
    from ablate.models.loading import resolve_source

    kind, location = resolve_source(model_source)
    if kind == "config":
        from ablate.config.errors import SpecError

        raise SpecError(
            "a random-init config is no reference model",
            key="--base",
            value=model_source,
            allowed="package:MODULE, a model folder or a hub id",
        )
    folder = Path(sweep_dir) / "base" / base_folder_name(model_source)
    check_request(sweep_dir, tasks, seeds, overrides, protocol, base=True, runs=False, data_root=data_root)
    rundir.atomic.write_json(folder / "source.json", {"model": model_source, "location": location})
    log(f"evaluating base model {model_source} on {', '.join(tasks)}")
    items, skipped = present_items(
        eval_items(tasks, (0,), overrides, seeds_override=seeds, key="--task"), data_root, key="--task"
    )
    for line in skipped_lines(skipped):
        log(line)
    record_skipped(folder / "scores", [i.task for i in items], skipped)
    evaluate_items(
        location,
        items,
        folder / "scores",
        data_root=data_root,
        device=str(pick_device("auto")),
        protocol=protocol,
        keep_stale=keep_stale,
        log=log,
    )
    return folder


def check_eval(specs: list[RunSpec], file: str | None = None) -> None:
    """Every task a sweep will evaluate (suites expanded) exists, reads, and takes the sweep's fine-tuning
    overrides: checked before anything is submitted."""
    from ablate.config.errors import SpecError
    from ablate.evaluate.protocol import check_protocol
    from ablate.evaluate.tasks import load_task, load_task_data, resolve_settings

    seen: set[tuple] = set()
    for spec in specs:
        check_protocol(spec.eval.protocol, key="base.eval.protocol", file=file)
        items = spec_items(spec, key="base.eval.tasks", file=file, present_only=True)
        _check_seeds_read(spec, file)
        for item in items:
            key = (item.task, repr(sorted(item.finetune.items())), spec.eval.protocol, spec.data.data_root)
            if key in seen:
                continue
            seen.add(key)
            try:
                task = load_task(item.task)
                resolve_settings(task, item.finetune, spec.eval.protocol)
                load_task_data(task, spec.data.data_root)
            except SpecError as exc:
                key = f"eval.{exc.key}" if exc.file is None and (exc.key or "").startswith("finetune") else exc.key
                raise SpecError(
                    f"eval task {item.task!r}: {exc.message}",
                    file=exc.file or file,
                    key=key or "base.eval.tasks",
                    value=exc.value,
                    allowed=exc.allowed,
                ) from None
        read_key = (spec.eval.tasks, repr(sorted(spec.eval.finetune.items())), spec.eval.protocol)
        if read_key not in seen:
            seen.add(read_key)
            check_overrides_read(spec, file, items)


def _check_seeds_read(spec: RunSpec, file: str | None) -> None:
    """`eval.seeds` other than the default, when every entry is a suite (whose tasks take its seeds), would
    be dropped without a word."""
    from ablate.config.errors import SpecError
    from ablate.config.spec import EvalSpec
    from ablate.evaluate.suites import is_suite

    tasks = spec.eval.tasks
    if tasks and all(is_suite(t) for t in tasks) and spec.eval.seeds != EvalSpec().seeds:
        raise SpecError(
            "no eval task reads it: a suite's tasks take the suite's seeds",
            file=file,
            key="base.eval.seeds",
            value=list(spec.eval.seeds),
            allowed="no eval.seeds with suites alone (write a suite file for other seeds)",
        )


def check_overrides_read(spec: RunSpec, file: str | None, items: list[EvalItem] | None = None) -> None:
    """Every key of `eval.finetune` (and of each suite's `finetune`) is read by at least one of the run's
    tasks (a pooling for NER tasks only, LoRA settings without method lora: dropped without a word
    otherwise)."""
    from ablate.config.errors import SpecError
    from ablate.evaluate.suites import PREFIX, load_suite, suites_dir

    if not spec.eval.tasks:
        return  # kept for a later `ablate evaluate --task`
    items = items if items is not None else spec_items(spec, file=file)
    groups = [(items, spec.eval.finetune, "eval.finetune", file)]
    for suite in dict.fromkeys(i.suite for i in items if i.suite):
        groups.append(
            (
                [i for i in items if i.suite == suite],
                load_suite(suite).finetune,
                "finetune",
                str(suites_dir() / f"{suite}.yaml"),
            )
        )
    for group, keys, where, in_file in groups:
        unread = _unread(spec.eval.protocol, group, keys)
        if unread:
            key, why = next(iter(unread.items()))
            raise SpecError(
                f"no eval task reads it: {why}",
                file=in_file,
                key=f"{where}.{key}",
                value=keys[key],
                allowed="settings the tasks "
                + ", ".join(i.task for i in group)
                + " read"
                + (f" (of {PREFIX}{group[0].suite})" if where == "finetune" else ""),
            )


def _unread(protocol: str | None, items: list[EvalItem], keys: dict) -> dict[str, str]:
    """The keys of `keys` that none of `items` (fine-tuned under `protocol`) reads, with why."""
    from ablate.evaluate.tasks import load_task, resolve_settings, unread_settings

    unread: dict[str, str] = {}
    for n, item in enumerate(items):
        task = load_task(item.task)
        method = resolve_settings(task, item.finetune, protocol).method
        here = unread_settings(keys, method, task.type)
        unread = here if n == 0 else {k: why for k, why in unread.items() if k in here}
    return unread
