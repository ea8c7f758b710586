"""What the cost plan (ablate.plan.cost) needs, gathered from files: the throughput (--tokens-per-s, or the
sweep's calibration.json, read here and written by ablate.launch.calibrate), the fine-tuning work of each
run (the tasks' train / dev / test sizes and epochs, or steps, under the run's fine-tuning settings, and where
no fine-tuning throughput was measured, its FLOPs for an estimate: predict.finetune_estimate), what is known of
each corpus's tokens (launch.preparation.corpus_sizes: prepared, estimated from its bytes, unknown or
missing) for the epochs each run reads it, and for `ablate status` what finished runs took (records/run.json,
score files).

May import: config, store, data (mixture), plan, evaluate, launch.preparation, predict.finetune_estimate.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

from ablate.config.base import validate
from ablate.config.errors import SpecError
from ablate.config.grid import GridSpec, load_grid
from ablate.config.launcher import Launcher
from ablate.config.spec import RunSpec
from ablate.data.mixture import uses_own_data
from ablate.predict.finetune_estimate import TokenCounter, with_estimates
from ablate.launch.preparation import corpus_key, corpus_sizes, source_specs
from ablate.plan.data_plan import plan_lines, source_epochs_cell
from ablate.plan.cost import (
    Actual,
    ArmCost,
    Calibration,
    FinetuneKey,
    FinetuneWork,
    Throughput,
    arm_cost,
    branched_cost,
    branching_lines,
    calibrated_throughput,
    compare_rows,
    cost_rows,
    describe_plan,
    given_throughput,
    matching_throughput,
)
from ablate.plan.eval_cost import finetune_task_rows
from ablate.plan.epochs import GRID_KEY, OVER, epochs_cell
from ablate.plan.grid import PlannedRun
from ablate.plan.objective_tokens import objective_rows
from ablate.store import rundir
from ablate.store.sweep import SweepFolder


def read_calibration(path: Path) -> Calibration | None:
    """The calibration at `path`; None when there is none; a SpecError naming the file when it is unreadable."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        data = rundir.read_json(path)
    except (OSError, ValueError) as exc:
        raise SpecError(
            f"unreadable calibration ({exc}); re-run `ablate calibrate GRID`", file=str(path)
        ) from None
    return validate(Calibration, data, str(path), "calibration")


# the fine-tuning settings that set its speed: one throughput is measured per (model, task, these); batching
# and precision since issue 32 (a calibration made before times another computation: it is made again)
SPEED_SETTINGS = (
    "method",
    "batch_size",
    "eval_batch_size",
    "max_length",
    "lora_r",
    "group_by_length",
    "length_pieces",
    "precision",
)


@dataclass
class FinetunePlan:
    work: dict[str, list[FinetuneWork]] = field(default_factory=dict)  # run id -> its fine-tuning
    jobs: dict[FinetuneKey, tuple] = field(default_factory=dict)  # key -> (a spec, its settings)
    notes: dict[str, None] = field(default_factory=dict)  # caps past a task's data: all of it is used


def cap_notes(task: str, caps: dict[str, int | None], sizes: dict[str, int]) -> list[str]:
    """A max_train_examples / max_eval_examples larger than the split it caps: said, not clamped silently."""
    names = {"train": "max_train_examples", "dev": "max_eval_examples", "test": "max_eval_examples"}
    return [
        f"{task}: {names[s]} {caps[s]:,} is more than its {sizes[s]:,} {s} examples: all {sizes[s]:,} are used"
        for s in ("train", "dev", "test")
        if caps[s] and caps[s] > sizes[s]
    ]


class TaskWork(NamedTuple):
    """One task under one run's fine-tuning settings."""

    name: str
    speed: str  # the settings that set its speed, as JSON
    settings: object  # the resolved ablate.evaluate.tasks.FinetuneSettings
    examples: dict[str, list]  # train, dev, test: what it fine-tunes and evaluates on (the caps applied)
    max_length: int  # the settings' max_length, else the task's (the model's context may cut it further)
    notes: list[str]  # the caps past its data


def _task_work(item, spec: RunSpec) -> TaskWork:
    """One task (an ablate.evaluate.suites.EvalItem) under its settings."""
    from ablate.evaluate.tasks import capped, load_task, load_task_data, resolve_settings

    task = load_task(item.task)
    settings = resolve_settings(task, item.finetune, spec.eval.protocol)
    splits = load_task_data(task, spec.data.data_root).splits
    speed = {k: getattr(settings, k) for k in SPEED_SETTINGS}
    speed["max_length"] = settings.max_length or task.max_length
    if settings.method != "lora":
        speed.pop("lora_r")
    cap = {
        "train": settings.max_train_examples,
        "dev": settings.max_eval_examples,
        "test": settings.max_eval_examples,
    }
    examples = {s: capped(splits[s], cap[s], settings.subset) for s in ("train", "dev", "test")}
    notes = cap_notes(task.name, cap, {s: len(splits[s]) for s in splits})
    return TaskWork(task.name, json.dumps(speed, sort_keys=True), settings, examples, speed["max_length"], notes)


def finetune_plan(
    specs: list[RunSpec], ids: list[str] | None = None, counter: TokenCounter | None = None
) -> FinetunePlan:
    """Each spec's fine-tuning work (under its run id, or `ids`: a derived run's spec has its into run's id),
    and each distinct (model, task, speed settings) once with a spec and the resolved settings that have it
    (what `ablate calibrate` times). With `counter`, each work's FLOPs per example too (for an estimate where
    no fine-tuning throughput is measured: ablate.predict.finetune_estimate)."""
    from ablate.evaluate.suites import spec_items

    plan, seen, flops = FinetunePlan(), {}, {}
    for spec, rid in zip(specs, ids or [s.run_id for s in specs]):
        work = []
        for item in spec_items(spec, present_only=True):  # a suite task without data is skipped
            where = (
                item.task,
                json.dumps(item.finetune, sort_keys=True, default=str),
                spec.eval.protocol,
                spec.data.data_root,
            )
            if where not in seen:
                seen[where] = _task_work(item, spec)
            task = seen[where]
            settings, sizes = task.settings, [len(task.examples[s]) for s in ("train", "dev", "test")]
            plan.notes.update(dict.fromkeys(task.notes))
            per_example = None
            if counter is not None:
                tokens = (*where, spec.model, spec.tokenizer or spec.model)
                if tokens not in flops:
                    flops[tokens] = counter.example_flops(spec, settings, task.examples, task.max_length)
                per_example = flops[tokens]
            key = FinetuneKey(spec.model, task.name, task.speed)
            work.append(
                FinetuneWork(
                    key,
                    len(item.seeds),
                    settings.epochs,
                    *sizes,
                    max_steps=settings.max_steps,
                    batch=settings.batch_size,
                    eval_every=settings.eval_every,
                    flops=per_example,
                    eval_batch=settings.eval_batch_size,
                )
            )
            plan.jobs.setdefault(key, (spec, settings))
        plan.work[rid] = work
    return plan


def _costs(
    runs: list[tuple[str, dict, RunSpec]],
    throughput: Throughput | None,
    launcher: Launcher,
    executors: dict[str, str],
    finetune: FinetunePlan | None,
) -> dict[str, ArmCost]:
    return {
        rid: arm_cost(
            rid,
            axes,
            spec,
            throughput,
            launcher.ranks(executors.get(rid)),
            launcher.gpus(executors.get(rid)),
            finetune.work.get(rid) if finetune else None,
        )
        for rid, axes, spec in runs
    }


def dry_run_cost(
    grid: GridSpec,
    grid_file: str,
    runs: list[PlannedRun],
    executor: str,
    results_root: Path,
    tokens_per_s: float | None,
    tree=None,
    transplants=(),
) -> tuple[list[str], list[dict]]:
    """The cost plan of a grid, its runs' pretraining and fine-tuning and its transplants' fine-tuning (derived
    runs, ablate.plan.transplants: no pretraining) in one table: its header lines and table rows. The
    throughput is --tokens-per-s, else the sweep's calibration (a SpecError when that was made for another
    grid), else none (steps and tokens). With `tree` (ablate.plan.branching) a branched run counts only its
    steps after its branch step."""
    specs = [r.spec for r in runs]
    tuned, tuned_ids = (
        specs + [t.spec for t in transplants],
        [r.run_id for r in runs] + [t.run_id for t in transplants],
    )
    calibration, throughput, finetune = None, None, None
    path = SweepFolder(Path(results_root) / grid.sweep).calibration
    if tokens_per_s is not None:
        throughput = given_throughput(tokens_per_s)
    else:
        calibration = read_calibration(path)
        if calibration is not None:
            finetune = finetune_plan(tuned, tuned_ids) if calibration.finetuning else None
            throughput = matching_throughput(
                calibration, str(path), grid.sweep, specs, list(finetune.jobs) if finetune else [], grid_file
            )
    if throughput is not None and finetune is None and any(s.eval.tasks for s in tuned):
        # no fine-tuning was measured
        throughput, finetune = estimated(throughput, specs, tuned, tuned_ids, measured_floors(calibration, path))
    costs = _costs(
        [(r.run_id, r.axes, r.spec) for r in runs],
        throughput,
        grid.launcher,
        {r.run_id: executor for r in runs},
        finetune,
    )
    header = describe_plan(
        throughput,
        grid_file,
        executor,
        grid.launcher.gpus(executor),
        grid.launcher.ranks(executor),
        calibration,
        any(s.eval.tasks for s in specs),
    )
    corpus_lines, epochs = corpus_epochs(specs, grid_file)
    costs, saved = _branched(costs, runs, tree, throughput, grid.launcher, executor)
    derived = _transplant_costs(transplants, throughput, grid.launcher, executor, finetune)
    epochs.update({cost.run_id: "-" for cost in derived})
    return corpus_lines + header + saved, cost_rows([*costs.values(), *derived], epochs)


def objective_breakdown(runs: list[PlannedRun], tree=None) -> tuple[list[str], list[dict]]:
    """The dry run's tokens by objective per phase (ablate.plan.objective_tokens: each mixture member
    counted), of what is trained: with `tree` a branched run's steps after its branch step."""
    starts = {} if tree is None else {rid: branch.step for rid, branch in tree.branches.items()}
    rows = objective_rows([(r.run_id, r.axes, r.spec, starts.get(r.run_id, 0)) for r in runs])
    return [
        "tokens by objective per phase (a mixture's members by their weights; what is trained, "
        "branched runs after their branch step):"
    ], rows


def _transplant_costs(
    transplants, throughput: Throughput | None, launcher: Launcher, executor: str, finetune: FinetunePlan | None
) -> list[ArmCost]:
    """A derived run's cost (ablate.plan.transplants.PlannedTransplant): built from two finished runs, so no
    pretraining, only its fine-tuning."""
    costs = _costs(
        [(t.run_id, t.spec.labels.get("axes", {}), t.spec) for t in transplants],
        throughput,
        launcher,
        {t.run_id: executor for t in transplants},
        finetune,
    )
    return [
        replace(costs[t.run_id], steps=0, tokens=0, hours=None if throughput is None else 0.0) for t in transplants
    ]


def _branched(
    costs: dict[str, ArmCost],
    runs: list[PlannedRun],
    tree,
    throughput: Throughput | None,
    launcher: Launcher,
    executor: str,
) -> tuple[dict[str, ArmCost], list[str]]:
    """The costs of what is really trained under the tree (children: after their branch step), and the
    savings lines."""
    if tree is None or not tree.branches:
        return costs, []
    trained = {
        r.run_id: branched_cost(
            costs[r.run_id],
            r.spec,
            getattr(tree.branches.get(r.run_id), "step", 0),
            throughput,
            launcher.ranks(executor),
        )
        for r in runs
    }
    return trained, branching_lines(list(costs.values()), list(trained.values()), len(tree.branches))


def finetune_breakdown(
    grid: GridSpec, runs: list[PlannedRun], results_root: Path, transplants=(), tokens_per_s: float | None = None
) -> tuple[list[str], list[dict]]:
    """The dry run's fine-tuning per task, the runs' and the transplants' (ablate.plan.transplants): a line per
    suite the grid names (its tasks and seeds), and a row per task (ablate.plan.cost.finetune_task_rows),
    timed from the sweep's calibration when it timed fine-tuning, else estimated from the fine-tuning's FLOPs
    at the pretraining throughput (--tokens-per-s, else the calibration's), as the cost plan is."""
    from ablate.evaluate.suites import PREFIX, present_items, skipped_lines, spec_items, suite_lines

    pairs = [(r.spec, r.run_id) for r in runs] + [(t.spec, t.run_id) for t in transplants]
    pairs = [(spec, rid) for spec, rid in pairs if spec.eval.tasks]
    specs = [s for s, _ in pairs]
    if not specs:
        return [], []
    groups = {i.task: PREFIX + i.suite for s in specs for i in spec_items(s) if i.suite}
    lines = [line for tasks in dict.fromkeys(s.eval.tasks for s in specs) for line in suite_lines(tasks)]
    blocks = {(s.eval.tasks, s.data.data_root): s for s in specs}  # a grid's runs mostly share one
    for spec in blocks.values():
        lines += skipped_lines(present_items(spec_items(spec), spec.data.data_root)[1])
    throughput, plan, said = _per_task_throughput(grid, runs, pairs, results_root, tokens_per_s)
    lines += said + [f"warning: {note}" for note in plan.notes]
    return lines, finetune_task_rows(plan.work, throughput, groups)


def _per_task_throughput(
    grid: GridSpec, runs: list[PlannedRun], pairs: list, results_root: Path, tokens_per_s: float | None
) -> tuple[Throughput | None, FinetunePlan, list[str]]:
    """The per-task table's throughput as the cost plan's (--tokens-per-s, else the sweep's calibration), the
    fine-tuning work of `pairs` (spec, run id), and a line on where its hours come from."""
    specs, ids = [s for s, _ in pairs], [rid for _, rid in pairs]
    path = SweepFolder(Path(results_root) / grid.sweep).calibration
    calibration = None if tokens_per_s is not None else read_calibration(path)
    if calibration is not None and calibration.finetuning:
        said = [f"hours measured: the examples/s of `ablate calibrate` ({path})"]
        return calibrated_throughput(calibration, str(path)), finetune_plan(specs, ids), said
    if tokens_per_s is None and calibration is None:
        return None, finetune_plan(specs, ids), []
    pretraining = (
        given_throughput(tokens_per_s) if calibration is None else calibrated_throughput(calibration, str(path))
    )
    throughput, plan = estimated(
        pretraining, [r.spec for r in runs], specs, ids, measured_floors(calibration, path)
    )
    said = ["hours marked (estimated): from the fine-tuning's FLOPs, as the cost plan below says"]
    return throughput, plan, said if throughput.estimate_basis else []


def estimated(
    throughput: Throughput,
    pretraining: list[RunSpec],
    specs: list[RunSpec],
    ids: list[str],
    floors: dict[str, tuple[float, str]] | None = None,
) -> tuple[Throughput, FinetunePlan]:
    """Where no fine-tuning throughput was measured: the specs' fine-tuning work with its FLOPs, and the
    throughput with the FLOP rate of each model's `pretraining` at it and each model's step floor (`floors`,
    measured; else the default) (ablate.predict.finetune_estimate)."""
    counter = TokenCounter()
    plan = finetune_plan(specs, ids, counter)
    return with_estimates(throughput, pretraining, counter, floors), plan


def measured_floors(calibration: Calibration | None, path) -> dict[str, tuple[float, str]]:
    """model -> (seconds of a fine-tuning step, where measured) from a calibration's step floors."""
    if calibration is None:
        return {}
    device = calibration.hardware.get("gpu") or calibration.hardware.get("device", "?")
    return {f.model: (f.step_s, f"{device}, {path}") for f in calibration.step_floors}


def corpus_epochs(specs: list[RunSpec], grid_file: str) -> tuple[list[str], dict[str, str]]:
    """The dry run's lines on each corpus (its tokens, and how they are known; a warning when it is missing or
    some run reads it too often) and each run's epochs cell, by run id."""
    sizes, lines = corpus_sizes(specs, grid_file)
    epochs = {}
    for spec in specs:
        if uses_own_data(spec):  # tokens per source per phase, epochs per source
            by_source = {one.data.corpus: sizes[corpus_key(one)] for one in source_specs(spec)}
            lines += plan_lines(
                spec,
                {k: v.tokens for k, v in by_source.items()},
                "-".join(map(str, (spec.labels.get("axes") or {}).values())) or "run",
            )
            epochs[spec.run_id] = source_epochs_cell(spec, by_source)
        else:
            epochs[spec.run_id] = epochs_cell(spec, sizes[corpus_key(spec)])
    over = [rid for rid, cell in epochs.items() if cell.endswith(OVER)]
    if over:
        estimated = " (by the estimate)" if any("estimate" in epochs[rid] for rid in over) else ""
        lines.append(
            f"warning: {len(over)} of {len(specs)} runs (epochs marked{OVER}) would{estimated} read their "
            f"corpus more than data.max_epochs times, or hold more sequences in a batch than it has: a real "
            f"submission refuses them (exit 2); supply a larger corpus, or allow repetition with {GRID_KEY}"
        )
    return lines, epochs


def _actual(run_dir: Path, spec: RunSpec) -> Actual | None:
    """What a finished run took: records/run.json's wall time, and its score files' (each task x seed of its
    eval settings; None when one is missing)."""
    try:
        record = rundir.read_json(run_dir / "records" / "run.json")
        scores = rundir.read_scores(run_dir, run_dir.name)
    except (OSError, ValueError):
        return None
    if not isinstance(record.get("wall_time_s"), (int, float)):
        return None
    walls = {(r["task"], r["finetune_seed"]): r["wall_time_s"] for r in scores}
    from ablate.evaluate.suites import spec_items

    wanted = [(i.task, s) for i in spec_items(spec, present_only=True) for s in i.seeds]
    finetune = sum(walls[w] for w in wanted) if all(w in walls for w in wanted) else None
    return Actual(float(record["wall_time_s"]), finetune)


def status_comparison(
    folder: SweepFolder, tokens_per_s: float | None = None
) -> tuple[str, list[dict], str] | None:
    """For `ablate status`: (where the estimate comes from, a row per finished run with an estimate, the
    totals line), or None when the sweep has no calibration and no --tokens-per-s was given. Runs whose
    combination the calibration did not measure have no estimate (the grid may have changed since)."""
    if tokens_per_s is not None:
        throughput, calibration = given_throughput(tokens_per_s), None
    else:
        calibration = read_calibration(folder.calibration)
        if calibration is None:
            return None
        throughput = calibrated_throughput(calibration, str(folder.calibration))
    try:
        launcher = load_grid(folder.root / "grid.yaml").launcher
    except SpecError:  # no grid (a tune's folder) or an unreadable one: one process, one GPU
        launcher = Launcher()
    runs, executors, actual = [], {}, {}
    for rid in folder.run_ids():
        run_dir = folder.run(rid)
        try:
            status = rundir.read_status(run_dir)
            spec = rundir.read_spec(run_dir)
        except (OSError, ValueError):  # CorruptStatus and invalid specs too: the status table says so
            continue
        if status.get("state") != "done":
            continue
        done = _actual(run_dir, spec)
        if done is not None:
            runs.append((rid, spec.labels.get("axes", {}), spec))
            executors[rid] = status.get("executor")
            actual[rid] = done
    finetune = None
    if calibration is not None and calibration.finetuning:
        try:
            finetune = finetune_plan([spec for _, _, spec in runs])
        except SpecError:  # a task file or its data gone since: fine-tuning not estimated
            finetune = None
    costs = _costs(runs, throughput, launcher, executors, finetune)
    for rid, _, spec in runs:  # a run that started from its parent's checkpoint trained only what followed
        started = rundir.branched(folder.run(rid))
        if started and started.get("from") == "parent":
            costs[rid] = branched_cost(
                costs[rid], spec, started["step"], throughput, launcher.ranks(executors.get(rid))
            )
    rows, line = compare_rows(costs, actual)
    return f"estimate vs actual (throughput {throughput.source}; training steps only):", rows, line
