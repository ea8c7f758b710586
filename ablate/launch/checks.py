"""A grid file checked as far as it can be before anything runs or is timed (what `ablate sweep` and
`ablate calibrate` start with): expanded, every model's family and depth, every phase plan against its model's
config, compute parity of the arms it compares, the catalogued datasets it reads (the data root lacking one:
the fetch command is named), every eval task, every corpus and the probe's held-out texts, the grid's
transplants against its runs, and the causal preflight per model. Any problem is a SpecError naming the file.

May import: config, store, plan, analysis, evaluate, train, launch.data_needs, launch.preparation,
launch.transplants, launch.trackers, predict.gpu_memory, predict.finetune_memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ablate.analysis.probe import check_probe_texts
from ablate.config.grid import GridSpec, load_grid, unused_entries
from ablate.evaluate.runs import check_eval
from ablate.evaluate.tasks import task_texts
from ablate.launch.data_needs import absent_probe_sources, check_data_root, missing_probe_data
from ablate.launch.preparation import check_corpora
from ablate.launch.trackers import check_installed as check_trackers
from ablate.launch.transplants import check_tasks
from ablate.plan.grid import PlannedRun, expand, resolve_layers, resolve_models
from ablate.plan.model_fit import check_model_fit
from ablate.plan.parity import check_parity, comparison_groups, parity_lines
from ablate.plan.rounding import rounding_notes
from ablate.plan.transplants import plan_transplants
from ablate.train.preflight import check_models


@dataclass(frozen=True)
class CheckedGrid:
    grid: GridSpec
    runs: list[PlannedRun]
    models: dict[str, tuple]  # model source -> (family, depth)
    plans: dict[str, list]  # run id -> its phase plans
    causal: dict[tuple, object]  # (model, tokenizer, implementation) -> preflight result, None without CLM
    transplants: list  # the grid's planned transplants (ablate.plan.transplants)
    warnings: list[str]  # e.g. a transplant's seed one arm lacks
    parity: list[str]  # the compute parity check, a line per comparison group
    tree: object = None  # shared prefixes (plan.branching.BranchTree); None: `branching: false`
    notes: tuple = ()  # what the dry run says on stderr, e.g. token lengths rounded to whole steps
    memory: list | None = None  # each run's predicted GPU peak per phase (predict.gpu_memory); None: no limit
    finetune_memory: list | None = None  # each fine-tuning step's predicted peak (predict.finetune_memory)


def checked_grid(path: str, executor: str | None = None, retry_in: Path | None = None) -> CheckedGrid:
    """`retry_in`: the results root of a sweep run with --retry-failed, whose runs that ran out of GPU memory
    move `micro_batch_size: auto` below their micro-batch (predict.gpu_memory.resolve_auto)."""
    from ablate.predict.finetune_memory import finetune_memory_plan
    from ablate.predict.gpu_memory import memory_plan, resolve_auto

    grid = load_grid(path)
    executor = executor or grid.launcher.executor
    runs = expand(grid, file=path)
    models = resolve_models(runs, file=path)
    runs, auto_notes, retried = resolve_auto(
        runs, comparison_groups(runs), grid.launcher, executor, path, _ran_out(retry_in, grid.sweep)
    )
    plans = resolve_layers(runs, file=path, models=models)
    specs = [r.spec for r in runs]
    check_model_fit(specs, file=path)
    groups = comparison_groups(runs)
    check_parity(groups, grid.allow_unequal_compute, file=path)
    transplants, warnings = plan_transplants(grid, runs, models, file=path)
    check_data_root(specs, path)
    check_trackers(specs, file=path)
    check_eval(specs, file=path)
    check_tasks(transplants, file=path)
    check_corpora(specs, file=path)
    probe_missing = missing_probe_data(specs, path)  # a submission refuses them (require_probe_data)
    check_probe_texts(specs, file=path, read_task=task_texts, absent=absent_probe_sources(specs))
    notes, rounded = rounding_notes(specs)
    memory = memory_plan(runs, grid.launcher, executor, path)
    finetune_memory = finetune_memory_plan(runs, grid.launcher, executor, path)
    return CheckedGrid(
        grid,
        runs,
        models,
        plans,
        check_models(specs, file=path),
        transplants,
        [f"{path}: {w}" for w in unused_entries(grid) + rounded]
        + warnings
        + [f"{path}: {e.message}" for e in probe_missing]
        + [f"{path}: {line}" for line in retried],
        parity_lines(groups, grid.allow_unequal_compute),
        sweep_tree(grid, runs, plans),
        tuple(notes + auto_notes),
        memory,
        finetune_memory,
    )


def _ran_out(results: Path | None, sweep: str):
    """Whether the run of an id in `sweep` failed out of GPU memory (None without a results root)."""
    if results is None:
        return None
    from ablate.store import rundir
    from ablate.store.sweep import SweepFolder

    folder = SweepFolder(Path(results) / sweep)

    def ran_out(run_id: str) -> bool:
        try:
            status = rundir.read_status(folder.run(run_id))
        except rundir.CorruptStatus:
            return False
        return status.get("state") == "failed" and bool(status.get("out_of_gpu_memory"))

    return ran_out


def sweep_tree(grid: GridSpec, runs: list[PlannedRun], plans: dict[str, list]):
    """The grid's tree of shared prefixes (ablate.plan.branching), None with `branching: false`."""
    from ablate.plan.branching import RunPlan, plan_tree
    from ablate.train.schedule import lr_at

    if not grid.branching:
        return None
    return plan_tree([RunPlan(r.run_id, r.spec, tuple(plans[r.run_id])) for r in runs], lr_at)
