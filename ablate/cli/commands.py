"""One function per `ablate` subcommand: parsed arguments in, calls to the stages, lines out, an exit code.

May import: every stage; holds no logic of its own beyond turning arguments into calls and results into lines.
"""

from __future__ import annotations

import itertools
import re
import sys
import textwrap
from pathlib import Path

from ablate.config.base import parse_assignments
from ablate.config.errors import SpecError

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
POLL_S = 5.0  # seconds between progress checks of a sweep or a tune


def _print_table(rows: list[dict]) -> None:
    import pandas as pd

    if not rows:
        print("(no runs)")
        return
    with pd.option_context("display.max_colwidth", 120, "display.width", 250):
        print(pd.DataFrame(rows).fillna("").to_string(index=False))


def _warn(problems: list[str]) -> None:
    for problem in problems:
        print(f"warning: {problem}", file=sys.stderr)


def _sweep(args, collected: bool = False):
    from ablate.store.sweep import resolve_sweep

    return resolve_sweep(args.sweep, args.results, collected=collected)


def _check_tasks(names) -> None:
    """Every --task names a task file or a suite (suite:NAME): an unknown name lists the known ones, sweep
    or no sweep."""
    from ablate.evaluate.suites import eval_items
    from ablate.evaluate.tasks import load_task

    for item in eval_items(names or (), (0,), key="--task"):
        load_task(item.task, key="--task")


def _print_finetuning(grid, runs, root, transplants, tokens_per_s) -> None:
    """The dry run's evaluation cost: the suites the grid names, then a row per task, the transplants'
    fine-tuning included (ablate.launch.estimates)."""
    from ablate.launch.estimates import finetune_breakdown

    lines, rows = finetune_breakdown(grid, runs, root, transplants, tokens_per_s)
    if rows or lines:
        print(
            "evaluation (fine-tuning per task; hours measured by `ablate calibrate`, else estimated):"
            + "".join(f"\n  {line}" for line in lines)
        )
        if rows:
            _print_table(rows)
        print()


def _print_protocol(runs) -> None:
    """The dry run's fine-tuning protocol of the tasks the runs evaluate, each rule with where it comes from
    (ablate.evaluate.protocol.protocol_lines)."""
    from ablate.evaluate.protocol import protocol_lines
    from ablate.evaluate.suites import spec_items
    from ablate.evaluate.tasks import load_task

    for profile in dict.fromkeys(r.spec.eval.protocol for r in runs):
        names = dict.fromkeys(i.task for r in runs if r.spec.eval.protocol == profile for i in spec_items(r.spec))
        tasks = [(t.name, t.language, t.type, t.max_length, t.primary_metric) for t in map(load_task, names)]
        if tasks:
            print("\n".join(protocol_lines(tasks, profile)) + "\n")


def _print_tree(tree, runs) -> None:
    """The dry run's tree of shared prefixes (ablate.plan.branching): who branches from whom, at which step."""
    from ablate.plan.branching import tree_lines

    if tree is None:
        print("branching: off (`branching: false`): every run trains from step 0\n")
        return
    labels = {
        r.run_id: ", ".join(f"{k}={v}" for k, v in r.axes.items() if k != "freeze" or v != "none") for r in runs
    }
    print("\n".join(tree_lines(tree, labels)) + "\n")


# ------------------------------------------------------------------ commands


def cmd_run(args) -> int:
    from ablate.analysis.probe import check_probe_texts
    from ablate.evaluate.tasks import task_texts
    from ablate.launch.data_needs import require_probe_data
    from ablate.config.paths import results_root
    from ablate.config.spec import load_run_spec
    from ablate.evaluate.runs import check_eval
    from ablate.launch import worker
    from ablate.launch.preparation import check_budgets, prepare_corpora, require_corpora, unprepared
    from ablate.launch.trackers import check_installed as check_trackers
    from ablate.plan.model_fit import check_model_fit
    from ablate.plan.phases import check_plan
    from ablate.store import rundir
    from ablate.train.preflight import check_models

    spec = load_run_spec(args.spec)
    if spec.micro_batch_size == "auto":
        raise SpecError(
            "micro_batch_size auto is resolved against a grid launcher's gpu_memory_gb; a run spec takes a number",
            file=str(args.spec),
            key="micro_batch_size",
            value="auto",
            allowed="a divisor of batch_size, or run it from a grid (docs/gpu-memory.md)",
        )
    check_plan(spec, file=str(args.spec))
    check_model_fit([spec], file=str(args.spec))
    check_trackers([spec], file=str(args.spec))
    check_eval([spec], file=str(args.spec))
    require_corpora([spec], file=str(args.spec))
    require_probe_data([spec], file=str(args.spec))
    check_probe_texts([spec], file=str(args.spec), read_task=task_texts)
    prepare_corpora(unprepared([spec]))  # what the run would do first (a changed corpus: exit 2)
    check_budgets([spec], file=str(args.spec))  # before the run folder exists
    for result in check_models([spec], file=str(args.spec)).values():
        if result is not None:
            print(result.describe())
    out = Path(args.out) if args.out else results_root(args.results) / Path(args.spec).stem / "runs" / spec.run_id
    worker.prepare_run_dir(spec, out)
    if rundir.read_status(out).get("state") == "failed":
        print(f"{out}: resuming a failed run", file=sys.stderr)
    try:
        state = worker.execute(out, stop_after_steps=args.stop_after_steps)
    except (rundir.AlreadyRunning, SpecError):  # bad input found in the run (e.g. a changed corpus): exit 2
        raise
    except Exception as exc:  # recorded in status.json and log.txt by the worker
        print(f"failed: {type(exc).__name__}: {exc}\n  log: {out / 'log.txt'}", file=sys.stderr)
        return EXIT_FAILED
    print(f"{state}: {out}")
    if state == "done":
        print(f"model: {out / 'model'}")
    return EXIT_OK if state in ("done", "interrupted") else EXIT_FAILED


def cmd_sweep(args) -> int:
    from ablate.config.paths import results_root
    from ablate.launch.checks import checked_grid
    from ablate.plan.cost import check_tokens_per_s
    from ablate.plan.replicates import seed_notes

    if check_tokens_per_s(args.tokens_per_s) is not None and not args.dry_run:
        raise SpecError(
            "a throughput is for the cost plan of a dry run",
            key="--tokens-per-s",
            value=args.tokens_per_s,
            allowed="--tokens-per-s with --dry-run",
        )
    checked = checked_grid(
        str(args.grid), args.executor, results_root(args.results) if args.retry_failed else None
    )
    grid, runs, transplants = checked.grid, checked.runs, checked.transplants
    executor = args.executor or grid.launcher.executor
    sweep_dir = results_root(args.results) / grid.sweep
    notes, warnings = seed_notes(runs)  # on stderr: stdout is the plan table
    for note in [*notes, *checked.notes] if args.dry_run else ():
        print(f"note: {note}", file=sys.stderr)
    _warn(warnings + checked.warnings)
    if args.dry_run:
        _print_dry_run(args, checked, executor, sweep_dir)
        return EXIT_OK
    from ablate.launch import scheduler
    from ablate.launch.drivers import HELD
    from ablate.launch.executors import require_executor
    from ablate.store import collect

    require_executor(executor, key="--executor" if args.executor else "launcher.executor")
    by_state = scheduler.run_sweep(
        grid,
        Path(args.grid),
        runs,
        results_root(args.results),
        executor,
        args.retry_failed,
        poll_s=args.poll,
        transplants=transplants,
        tree=checked.tree,
        wait=args.wait,
    )
    collected = collect.collect(sweep_dir)
    _warn(collected.problems + collected.warnings)
    done, failed = by_state.get("done", []), by_state.get("failed", [])
    others = {k: v for k, v in by_state.items() if k not in ("done", "failed")}
    print(
        f"summary: {len(done)} done, {len(failed)} failed"
        + "".join(f", {len(v)} {k}" for k, v in others.items())
        + f"; tables in {sweep_dir}"
    )
    for rid in failed:
        print(f"  failed {rid}: log {sweep_dir / 'runs' / rid / 'log.txt'}")
    if by_state.get(HELD):
        print(
            f"{len(by_state[HELD])} runs are left to the other drivers, workers or jobs named above: `ablate "
            f"status {grid.sweep}` follows them, `ablate sweep {args.grid} --wait` waits for them"
        )
    unfinished = [state for state in others if state != HELD]  # held elsewhere: not this driver's to finish
    return EXIT_OK if not failed and not unfinished and not collected.problems else EXIT_FAILED


def _print_dry_run(args, checked, executor: str, sweep_dir: Path) -> None:
    """What `ablate sweep --dry-run` prints: the plan table, transplants, the branching tree, fine-tunings,
    tokens by objective, the cost plan, GPU memory, parity, and a one-line summary."""
    from ablate.analysis.pairs import describe_pairs
    from ablate.config.paths import results_root
    from ablate.launch.estimates import dry_run_cost, objective_breakdown
    from ablate.plan.grid import plan_table
    from ablate.plan.transplants import transplant_table

    grid, runs, transplants = checked.grid, checked.runs, checked.transplants

    header, costs = dry_run_cost(
        grid,
        str(args.grid),
        runs,
        executor,
        results_root(args.results),
        args.tokens_per_s,
        checked.tree,
        transplants,
    )
    _print_table(
        plan_table(runs, checked.plans, checked.models, {k: "ok" if r else "-" for k, r in checked.causal.items()})
    )
    print()
    if transplants:
        print("transplants (derived runs: built and fine-tuned once the runs they need are done):")
        _print_table(transplant_table(transplants))
        print()
    _print_tree(checked.tree, runs)
    _print_finetuning(grid, runs, results_root(args.results), transplants, args.tokens_per_s)
    _print_protocol(runs)
    lines, by_objective = objective_breakdown(runs, checked.tree)
    print("\n".join(lines))
    _print_table(by_objective)
    print()
    print("\n".join(header))
    _print_table(costs)
    if checked.memory is not None:
        from ablate.predict import trace_cache

        print("\nGPU memory per device (predicted peak of a training step, docs/gpu-memory.md):")
        _print_table(checked.memory)
        print(trace_cache.summary())
    if checked.finetune_memory:
        print("\nGPU memory of fine-tuning (a step on each task's longest batch, predict.finetune_memory):")
        _print_table(checked.finetune_memory)
    print("\n".join(checked.parity))
    print(
        f"{len(runs)} runs"
        + (f", {len(transplants)} transplants" if transplants else "")
        + f"; executor {executor}; results in {sweep_dir}; dry run: nothing submitted; "
        + "".join(f"model {m} ({fam.name}, {depth} layers); " for m, (fam, depth) in checked.models.items())
        + describe_pairs([(r.run_id, r.spec) for r in runs])
    )


def cmd_calibrate(args) -> int:
    from ablate.config.paths import results_root
    from ablate.launch.calibrate import calibrate, check_steps
    from ablate.launch.checks import checked_grid
    from ablate.launch.preparation import require_corpora

    check_steps(args.steps, args.warmup)
    checked = checked_grid(str(args.grid))
    require_corpora([r.spec for r in checked.runs], file=str(args.grid))
    path, _ = calibrate(
        checked.grid.sweep,
        Path(args.grid),
        [r.spec for r in checked.runs],
        results_root(args.results),
        args.steps,
        args.warmup,
        finetune=not args.no_finetune,
    )
    print(f"calibration: {path}; `ablate sweep {args.grid} --dry-run` now prints hours and GPU-hours")
    return EXIT_OK


def cmd_prepare(args) -> int:
    from ablate.launch.preparation import prepare_corpora, require_corpora, specs_for_target

    specs = specs_for_target(args.target, args.tokenizer)
    if args.tokenizer:
        specs = [s.model_copy(update={"tokenizer": args.tokenizer}) for s in specs]
    require_corpora(specs, file=args.target)
    prepare_corpora(specs, workers=args.workers, verify=args.verify, shard_tokens=args.shard_tokens)
    return EXIT_OK


def cmd_status(args) -> int:
    from ablate.launch.estimates import status_comparison
    from ablate.launch.scheduler import status_rows
    from ablate.plan.cost import check_tokens_per_s

    tokens_per_s = check_tokens_per_s(args.tokens_per_s)
    sweep = _sweep(args)
    rows = status_rows(sweep)
    print(f"sweep {sweep.name} ({sweep.root})")
    _print_table(rows)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["state"]] = counts.get(r["state"], 0) + 1
    print(", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    compared = status_comparison(sweep, tokens_per_s)
    if compared is not None:
        source, estimate_rows, totals = compared
        print(f"\n{source}")
        if estimate_rows:
            _print_table(estimate_rows)
        print(totals)
    bad = sum(v for k, v in counts.items() if k in ("failed", "unreadable", "corrupt"))
    return EXIT_FAILED if bad else EXIT_OK


def cmd_collect(args) -> int:
    from ablate.store import collect

    sweep = _sweep(args)
    collected = collect.collect(sweep.root)
    _warn(collected.problems + collected.warnings)
    if args.cka_ratio:
        from ablate.analysis.ratio import add_cka_ratio

        n = add_cka_ratio(sweep.root, collected.tables, args.cka_ratio)
        if n:
            collect.write_tables(sweep.root, collected.tables)
            print(f"cka ratio: added to the layers table for {n} runs")
        else:
            print(
                "cka ratio: the sweep needs at least two MLM-baseline seeds (schedule mlm, freeze none) per model"
            )
    if args.pairs:
        from ablate.analysis.pairs import RULE, pairs_table

        collected.tables["pairs"] = pairs_table(sweep.root, collected.tables["runs"])
        collect.write_tables(sweep.root, {"pairs": collected.tables["pairs"]})
        print(f"pairs: {RULE}")
    for name, frame in collected.tables.items():
        print(f"{name}: {len(frame)} rows -> {sweep.root / (name + '.parquet')} (+ .csv)")
    failed = sum(collected.tables["runs"].get("status", []) == "failed") if len(collected.tables["runs"]) else 0
    return EXIT_FAILED if collected.problems or failed else EXIT_OK


def cmd_evaluate(args) -> int:
    from ablate.evaluate import runs as evaluate
    from ablate.evaluate.protocol import check_protocol

    overrides = parse_assignments(args.set, "--set")
    seeds = tuple(args.seeds) if args.seeds else None
    how = {"protocol": check_protocol(args.protocol), "keep_stale": args.keep_stale}
    tasks = evaluated_tasks(args.task, args.suite)
    _check_tasks(tasks)
    if args.base:
        from ablate.models.loading import resolve_source

        resolve_source(args.base, key="--base")
    if args.base_only and not args.base:
        raise SpecError("--base-only evaluates the base model: name it", key="--base", allowed="--base MODEL")
    sweep = _base_only_root(args) if args.base_only else None
    sweep = sweep or _sweep(args)
    # every check of the request (--set values, settings no task reads, data) before anything is written
    evaluate.check_request(
        sweep.root, tasks, seeds, overrides, how["protocol"], base=bool(args.base), runs=not args.base_only
    )
    if args.base:
        folder = evaluate.evaluate_base(sweep.root, args.base, tasks, seeds, overrides, **how)
        print(f"base model scores in {folder / 'scores'}")
    if not args.base_only:
        from ablate.launch.shares import run_placer

        counts = evaluate.evaluate_sweep(sweep.root, tasks, seeds, overrides, **how, place_for=run_placer(print))
        print(f"evaluated {counts['evaluated']} finished runs; {counts['not done']} not finished (skipped)")
    if not (sweep.root / "runs").is_dir():
        return EXIT_OK  # a base model alone, outside any sweep: nothing to collect
    args.cka_ratio, args.pairs = None, False
    return cmd_collect(args)


def evaluated_tasks(tasks, suites) -> tuple[str, ...]:
    """`ablate evaluate`'s --task entries, then each --suite NAME as suite:NAME; at least one."""
    from ablate.evaluate.suites import PREFIX

    named = tuple(tasks or ()) + tuple(PREFIX + s.removeprefix(PREFIX) for s in suites or ())
    if not named:
        raise SpecError(
            "nothing to evaluate",
            key="--task",
            allowed="--task NAME, --task suite:NAME or --suite NAME (repeatable)",
        )
    return named


def _base_only_root(args):
    """A base model evaluated alone goes into the named (or most recent) sweep; with neither, into the results
    root itself (<results>/base/NAME), so the first check on a fresh machine needs no sweep."""
    from ablate.config.paths import results_root
    from ablate.store.sweep import SweepFolder, list_sweeps

    if args.sweep or list_sweeps(args.results, False):
        return None
    return SweepFolder(results_root(args.results))


def cmd_report(args) -> int:
    from ablate import report
    from ablate.report.registry import check_figure, check_table
    from ablate.report.paper_tables import TABLES as RESULT_TABLES

    # names first: an unknown figure, table or option lists the known ones, whether or not a sweep exists
    options = parse_assignments(args.set, "--set") | ({"baseline": args.baseline} if args.baseline else {})
    reference = {"reference": args.reference} if args.reference else {}
    wants_page = args.html or args.serve
    if reference and not (args.table or wants_page):
        raise SpecError(
            "--reference sets the paper's numbers beside a table's or the page's",
            key="--reference",
            value=args.reference,
            allowed="with --table scores, --table freeze or --html",
        )
    figure_options = check_figure(args.figure, {} if wants_page or args.table else options) if args.figure else {}
    table_options = check_table(args.table, ({} if wants_page else options) | reference) if args.table else {}
    if wants_page:
        from ablate.report.html import serve, write_html
        from ablate.report.references import check_reference

        if args.reference:
            check_reference(args.reference)
        page = write_html(_sweep(args, collected=True).root, args.out, reference=args.reference)
        print(f"html: {page}")
        if args.serve:
            serve(page, args.port)
        return EXIT_OK
    if args.table:
        sweep = _sweep(args, collected=True)
        paths = report.make_table(args.table, sweep.root, args.out, **table_options)
        print(paths["md"].read_text())
        for kind, path in paths.items():
            print(f"{kind}: {path}")
        return EXIT_OK
    if not args.figure:
        print("figures: " + ", ".join(report.FIGURES) + "; tables: " + ", ".join(RESULT_TABLES))
        return EXIT_OK
    sweep = _sweep(args, collected=True)
    paths = report.make_figure(args.figure, sweep.root, args.out, **figure_options)
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    if report.FIGURES[args.figure].summary:
        print(report.score_summary(report.load_sweep(sweep.root)).to_string(index=False))
    return EXIT_OK


def cmd_transplant(args) -> int:
    from ablate.evaluate.transplant import plan_transplant
    from ablate.launch.transplants import run_here
    from ablate.store import collect

    _check_tasks(args.task)
    sweep = _sweep(args)
    runs = collect.collect(sweep.root, write=False).tables["runs"]
    tasks, seeds = tuple(args.task) if args.task else None, tuple(args.seeds) if args.seeds else None
    planned = plan_transplant(
        sweep.root, runs, args.source, args.target, args.layers, tasks, seeds, args.components, args.embeddings
    )
    failed = run_here(sweep.root, planned, tasks, seeds)
    print(
        f"transplants: {', '.join(t.run_id for t in planned)}"
        + (f"; failed: {', '.join(failed)}" if failed else "")
    )
    args.cka_ratio, args.pairs = None, False
    return max(cmd_collect(args), EXIT_FAILED if failed else EXIT_OK)


def cmd_tune(args) -> int:
    from ablate.config.paths import results_root
    from ablate.launch.executors import require_executor
    from ablate.tune.runner import dry_run_line, run_study
    from ablate.tune.spec import load_tune

    tune = load_tune(args.tune, storage=args.storage)
    executor = require_executor(
        args.executor or tune.spec.launcher.executor, key="--executor" if args.executor else "launcher.executor"
    )
    if args.dry_run:
        print(dry_run_line(tune, executor, results_root(args.results)))
        return EXIT_OK
    counts = run_study(tune, results_root(args.results), executor, poll_s=args.poll)
    return EXIT_FAILED if counts["fail"] else EXIT_OK


def cmd_dashboard(args) -> int:
    from ablate.tune.dashboard import serve_dashboard
    from ablate.tune.storage import resolve_storage

    url, _ = resolve_storage(args.study, args.storage, args.results)
    return serve_dashboard(url, args.host, args.port)


def _header_sentence(path: Path, width: int = 100) -> str:
    """The first sentence of a file's opening comment, shortened to `width` characters."""
    lines = path.read_text(encoding="utf-8").splitlines()
    header = " ".join(line.lstrip("# ") for line in itertools.takewhile(lambda s: s.startswith("#"), lines))
    sentence = re.split(r"(?<=\.)\s", header, maxsplit=1)[0]
    return textwrap.shorten(sentence, width, placeholder=" ...")


def cmd_grids(args) -> int:
    """The grids shipped with ablate (each with its first comment line), and the task and suite registries."""
    from ablate.config.paths import shipped_grids
    from ablate.evaluate.suites import list_suites, suites_dir
    from ablate.evaluate.tasks import list_tasks, tasks_dir

    folder = shipped_grids()
    print(
        f"grids shipped with ablate, in {folder}: `ablate sweep grids/NAME.yaml` reads one from any folder "
        "that has no grids/NAME.yaml of its own; copy one to edit it"
    )
    for path in sorted(folder.glob("*.yaml")):
        print(f"  grids/{path.name:20} {_header_sentence(path)}")
    print(f"tasks in {tasks_dir()}: {', '.join(list_tasks())}")
    print(f"suites in {suites_dir()}: {', '.join(list_suites())}")
    return EXIT_OK


def cmd_export(args) -> int:
    from ablate.release.export import export_run
    from ablate.release.hub import PushFailed, check_repo_id, hub_token, push_folder

    repo = check_repo_id(args.push_to_hub) if args.push_to_hub else None  # before anything is written
    sweep = _sweep(args, collected=True)
    done = export_run(
        sweep.root,
        args.run_or_arm,
        args.out,
        bf16=args.bf16,
        force=args.force,
        seed=args.seed,
        baseline=args.baseline,
        repo_id=repo,
    )
    for note in done.notes:
        print(f"note: {note}", file=sys.stderr)
    print(
        f"exported run {done.chosen.run_id} (arm {done.chosen.arm}, seed {done.chosen.seed}, {done.dtype}) "
        f"-> {done.out}"
    )
    if repo is None:
        return EXIT_OK
    try:
        url = push_folder(done.out, repo, hub_token(done.out, repo), f"ablate export of run {done.chosen.run_id}")
    except PushFailed as exc:  # the hub unreachable or refusing: a runtime failure, the folder is complete
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(f"pushed: {url}")
    return EXIT_OK


# ------------------------------------------------------------------ parser
