"""The `ablate` command: parse, call, print.

Exit codes: 0 ok; 1 some runs failed, or records could not be read; 2 bad input (the message names the file,
key, value and what is allowed; nothing was submitted); 130 interrupted.

May import: every stage; holds no logic of its own beyond turning arguments into calls and results into lines.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import get_args

from ablate.config.base import parse_assignments
from ablate.config.errors import SpecError

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
POLL_S = 5.0   # seconds between progress checks of a sweep or a tune


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


# ------------------------------------------------------------------ commands

def cmd_run(args) -> int:
    from ablate.config.paths import results_root
    from ablate.config.spec import load_run_spec
    from ablate.evaluate.runs import check_eval
    from ablate.launch import worker
    from ablate.launch.preparation import check_corpora
    from ablate.plan.phases import check_plan
    from ablate.store import rundir
    from ablate.train.preflight import check_models

    spec = load_run_spec(args.spec)
    check_plan(spec, file=str(args.spec))
    check_eval([spec], file=str(args.spec))
    check_corpora([spec], file=str(args.spec))
    for result in check_models([spec], file=str(args.spec)).values():
        if result is not None:
            print(result.describe())
    out = Path(args.out) if args.out else results_root(args.results) / Path(args.spec).stem / "runs" / spec.run_id
    worker.prepare_run_dir(spec, out)
    if rundir.read_status(out).get("state") == "failed":
        print(f"{out}: resuming a failed run", file=sys.stderr)
    try:
        state = worker.execute(out, stop_after_steps=args.stop_after_steps)
    except (rundir.AlreadyRunning, SpecError):    # bad input found in the run (e.g. a changed corpus): exit 2
        raise
    except Exception as exc:   # recorded in status.json and log.txt by the worker
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
    from ablate.plan.grid import plan_table
    from ablate.plan.replicates import seed_notes
    from ablate.plan.transplants import transplant_table

    if check_tokens_per_s(args.tokens_per_s) is not None and not args.dry_run:
        raise SpecError("a throughput is for the cost plan of a dry run", key="--tokens-per-s",
                        value=args.tokens_per_s, allowed="--tokens-per-s with --dry-run")
    checked = checked_grid(str(args.grid))
    grid, runs, transplants = checked.grid, checked.runs, checked.transplants
    executor = args.executor or grid.launcher.executor
    sweep_dir = results_root(args.results) / grid.sweep
    notes, warnings = seed_notes(runs)   # on stderr: stdout is the plan table
    for note in notes if args.dry_run else ():
        print(f"note: {note}", file=sys.stderr)
    _warn(warnings + checked.warnings)
    if args.dry_run:
        from ablate.analysis.pairs import describe_pairs
        from ablate.launch.estimates import dry_run_cost

        header, costs = dry_run_cost(grid, str(args.grid), runs, executor, results_root(args.results),
                                     args.tokens_per_s)
        _print_table(plan_table(runs, checked.plans, checked.models,
                                {k: "ok" if r else "-" for k, r in checked.causal.items()}))
        print()
        if transplants:
            print("transplants (derived runs: built and fine-tuned once the runs they need are done):")
            _print_table(transplant_table(transplants))
            print()
        print("\n".join(header))
        _print_table(costs)
        print(f"{len(runs)} runs" + (f", {len(transplants)} transplants" if transplants else "")
              + f"; executor {executor}; results in {sweep_dir}; dry run: nothing submitted; "
              + describe_pairs([(r.run_id, r.spec) for r in runs]))
        return EXIT_OK
    from ablate.launch import scheduler
    from ablate.launch.executors import require_executor
    from ablate.store import tables

    require_executor(executor)
    by_state = scheduler.run_sweep(grid, Path(args.grid), runs, results_root(args.results), executor,
                                   args.retry_failed, poll_s=args.poll, transplants=transplants)
    collected = tables.collect(sweep_dir)
    _warn(collected.problems)
    done, failed = by_state.get("done", []), by_state.get("failed", [])
    others = {k: v for k, v in by_state.items() if k not in ("done", "failed")}
    print(f"summary: {len(done)} done, {len(failed)} failed"
          + "".join(f", {len(v)} {k}" for k, v in others.items()) + f"; tables in {sweep_dir}")
    for rid in failed:
        print(f"  failed {rid}: log {sweep_dir / 'runs' / rid / 'log.txt'}")
    return EXIT_OK if not failed and not others and not collected.problems else EXIT_FAILED


def cmd_calibrate(args) -> int:
    from ablate.config.paths import results_root
    from ablate.launch.calibrate import calibrate, check_steps
    from ablate.launch.checks import checked_grid

    check_steps(args.steps, args.warmup)
    checked = checked_grid(str(args.grid))
    path, _ = calibrate(checked.grid.sweep, Path(args.grid), [r.spec for r in checked.runs],
                        results_root(args.results), args.steps, args.warmup, finetune=not args.no_finetune)
    print(f"calibration: {path}; `ablate sweep {args.grid} --dry-run` now prints hours and GPU-hours")
    return EXIT_OK


def cmd_prepare(args) -> int:
    from ablate.launch.preparation import check_corpora, prepare_corpora, specs_for_target

    specs = specs_for_target(args.target, args.tokenizer)
    if args.tokenizer:
        specs = [s.model_copy(update={"tokenizer": args.tokenizer}) for s in specs]
    check_corpora(specs, file=args.target)
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
    from ablate.store import tables

    sweep = _sweep(args)
    collected = tables.collect(sweep.root)
    _warn(collected.problems)
    if args.cka_ratio:
        from ablate.analysis.probe import add_cka_ratio

        n = add_cka_ratio(sweep.root, collected.tables, args.cka_ratio)
        if n:
            tables.write_tables(sweep.root, collected.tables)
            print(f"cka ratio: added to the layers table for {n} runs")
        else:
            print("cka ratio: the sweep needs at least two MLM-baseline seeds (schedule mlm, freeze none) per model")
    if args.pairs:
        from ablate.analysis.pairs import RULE, pairs_table

        collected.tables["pairs"] = pairs_table(sweep.root, collected.tables["runs"])
        tables.write_tables(sweep.root, {"pairs": collected.tables["pairs"]})
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
    sweep = _sweep(args)
    if args.base:
        folder = evaluate.evaluate_base(sweep.root, args.base, tuple(args.task), seeds or (0,), overrides, **how)
        print(f"base model scores in {folder / 'scores'}")
    if not args.base_only:
        counts = evaluate.evaluate_sweep(sweep.root, tuple(args.task), seeds, overrides, **how)
        print(f"evaluated {counts['evaluated']} finished runs; {counts['not done']} not finished (skipped)")
    args.cka_ratio, args.pairs = None, False
    return cmd_collect(args)


def cmd_report(args) -> int:
    from ablate import report

    if args.html or args.serve:
        from ablate.report.html import serve, write_html

        page = write_html(_sweep(args, collected=True).root, args.out)
        print(f"html: {page}")
        if args.serve:
            serve(page, args.port)
        return EXIT_OK
    if args.table:
        sweep = _sweep(args, collected=True)
        options = parse_assignments(args.set, "--set") | ({"baseline": args.baseline} if args.baseline else {})
        paths = report.make_table(args.table, sweep.root, args.out, **options)
        print(paths["md"].read_text())
        for kind, path in paths.items():
            print(f"{kind}: {path}")
        return EXIT_OK
    if args.figure is None:
        print("figures: " + ", ".join(report.FIGURES) + "; tables: scores, freeze, divergence")
        return EXIT_OK
    sweep = _sweep(args, collected=True)
    options = parse_assignments(args.set, "--set") | ({"baseline": args.baseline} if args.baseline else {})
    paths = report.make_figure(args.figure, sweep.root, args.out, **options)
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    if args.figure == "deltas":
        print(report.score_summary(report.load_sweep(sweep.root)).to_string(index=False))
    return EXIT_OK


def cmd_transplant(args) -> int:
    from ablate.evaluate.transplant import plan_transplant
    from ablate.launch.transplants import run_here
    from ablate.store import tables

    sweep = _sweep(args)
    runs = tables.collect(sweep.root, write=False).tables["runs"]
    tasks, seeds = tuple(args.task) if args.task else None, tuple(args.seeds) if args.seeds else None
    planned = plan_transplant(sweep.root, runs, args.source, args.target, args.layers, tasks, seeds)
    failed = run_here(sweep.root, planned, tasks, seeds)
    print(f"transplants: {', '.join(t.run_id for t in planned)}" + (f"; failed: {', '.join(failed)}" if failed else ""))
    args.cka_ratio, args.pairs = None, False
    return max(cmd_collect(args), EXIT_FAILED if failed else EXIT_OK)


def cmd_tune(args) -> int:
    from ablate.config.paths import results_root
    from ablate.launch.executors import require_executor
    from ablate.tune.runner import dry_run_line, run_study
    from ablate.tune.spec import load_tune

    tune = load_tune(args.tune, storage=args.storage)
    executor = require_executor(args.executor or tune.spec.launcher.executor)
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


# ------------------------------------------------------------------ parser

def _executors() -> tuple[str, ...]:
    from ablate.config.grid import Launcher

    return get_args(Launcher.model_fields["executor"].annotation)


def build_parser() -> argparse.ArgumentParser:
    results = argparse.ArgumentParser(add_help=False)
    results.add_argument("--results", help="results root (default: $ABLATE_RESULTS or ./results)")
    sweep = argparse.ArgumentParser(add_help=False, parents=[results])
    sweep.add_argument("sweep", nargs="?", metavar="SWEEP", help="sweep name or folder (default: the most recent)")
    submit = argparse.ArgumentParser(add_help=False, parents=[results])
    submit.add_argument("--executor", choices=_executors(), help="overrides the file's launcher.executor")
    submit.add_argument("--poll", type=float, default=POLL_S, help=f"seconds between progress checks ({POLL_S:g})")
    submit.add_argument("--dry-run", action="store_true", help="check and print the plan, submit nothing")

    p = argparse.ArgumentParser(prog="ablate", description=__doc__.split("\n\n")[0],
                                epilog="Exit codes: 0 ok, 1 runs failed or records unreadable, 2 bad input.")
    sub = p.add_subparsers(dest="command", required=True)
    _add_run_commands(sub, results, sweep, submit)
    _add_analysis_commands(sub, results, sweep, submit)
    return p


def _add_run_commands(sub, results, sweep, submit) -> None:
    r = sub.add_parser("run", parents=[results], help="run one RunSpec in this process (resumes if interrupted)")
    r.add_argument("spec", help="run spec (YAML)")
    r.add_argument("--out", help="run folder (default: <results>/<spec name>/runs/<run id>)")
    r.add_argument("--stop-after-steps", type=int, default=None,
                   help="stop (with a checkpoint) after this many optimizer steps; re-run to resume")
    r.set_defaults(func=cmd_run)

    s = sub.add_parser("sweep", parents=[submit], help="expand a grid and run it (local, slurm or debug executor)")
    s.add_argument("grid", help="grid file (YAML)")
    s.add_argument("--retry-failed", action="store_true", help="re-submit runs that failed before")
    s.add_argument("--tokens-per-s", type=float, metavar="N", help="with --dry-run: training tokens/s of one "
                   "process (one GPU), for the cost plan's hours (default: the sweep's `ablate calibrate`)")
    s.set_defaults(func=cmd_sweep)

    cb = sub.add_parser("calibrate", parents=[results], help="time a few steps of each distinct model / objective "
                        "/ length / batch of a grid here and store the throughput with the sweep (the cost plan)")
    cb.add_argument("grid", help="grid file (YAML)")
    cb.add_argument("--steps", type=int, default=3, help="timed steps of each combination (default 3)")
    cb.add_argument("--warmup", type=int, default=2, help="untimed steps before them (default 2)")
    cb.add_argument("--no-finetune", action="store_true", help="do not time the grid's fine-tuning")
    cb.set_defaults(func=cmd_calibrate)

    pr = sub.add_parser("prepare", help="tokenize corpora once into memory-mapped shards (where runs read them)")
    pr.add_argument("target", help="a grid, a run spec, or a corpus path (file, glob or folder)")
    pr.add_argument("--workers", type=int, help="tokenizer processes (default: the cores this process may use)")
    pr.add_argument("--tokenizer", help="tokenizer (same forms as a run spec's model); default: the spec's")
    pr.add_argument("--verify", action="store_true", help="re-hash every prepared file and source against the "
                                                          "manifest (exit 2 on a mismatch)")
    pr.add_argument("--shard-tokens", type=int, help="tokens per shard file (default 2**28)")
    pr.set_defaults(func=cmd_prepare)

    st = sub.add_parser("status", parents=[sweep], help="per-run state of a sweep (and the cost estimate against "
                        "what finished runs took)")
    st.add_argument("--tokens-per-s", type=float, metavar="N", help="estimate with this throughput instead of "
                    "the sweep's calibration")
    st.set_defaults(func=cmd_status)

    c = sub.add_parser("collect", parents=[sweep], help="merge a sweep's run folders into tidy tables")
    c.add_argument("--cka-ratio", type=int, metavar="N_TEXTS",
                   help="also compute the paper's CKA ratio vs MLM seed noise on N held-out texts")
    c.add_argument("--pairs", action="store_true",
                   help="also write the pairs table: CKA per layer and phase end between twin arms and MLM seeds")
    c.set_defaults(func=cmd_collect)

    e = sub.add_parser("evaluate", parents=[sweep], help="fine-tune finished runs (and the base model) on tasks")
    e.add_argument("--task", action="append", required=True, help="task name in grids/tasks (repeatable)")
    e.add_argument("--seeds", type=int, nargs="+", help="fine-tuning seeds (default: each run's eval seeds)")
    e.add_argument("--set", action="append", metavar="KEY=VALUE", help="fine-tuning setting override")
    e.add_argument("--base", metavar="MODEL", help="also evaluate this base model as the reference")
    e.add_argument("--base-only", action="store_true", help="only the base model")
    e.add_argument("--protocol", metavar="NAME", help="fine-tuning profile over the task files: paper or smoke "
                                                      "(default: each run's eval.protocol, else the task files)")
    e.add_argument("--keep-stale", action="store_true",
                   help="keep scores whose task file, data or settings changed (marked stale) instead of "
                        "recomputing them")
    e.set_defaults(func=cmd_evaluate)


def _add_analysis_commands(sub, results, sweep, submit) -> None:
    rp = sub.add_parser("report", parents=[sweep], help="draw a figure from a sweep's tidy tables (PNG + SVG/PDF + CSV)")
    rp.add_argument("--figure", help="layers, deltas, curves, freeze, tune, divergence, persistence (no value: list them)")
    rp.add_argument("--table", help="scores, freeze or divergence: the paper's results tables (CSV + Markdown + LaTeX)")
    rp.add_argument("--baseline", help="the arm everything is compared with (default: the mlm schedule, no freezing)")
    rp.add_argument("--out", help="output folder, or a file path (.pdf for PDF)")
    rp.add_argument("--set", action="append", metavar="KEY=VALUE", help="figure option, e.g. measure=grad_norm")
    rp.add_argument("--html", action="store_true", help="one self-contained page of the sweep: <sweep>/report.html "
                                                         "(or --out PATH); re-run to refresh it")
    rp.add_argument("--serve", action="store_true", help="write the page, then serve it on 127.0.0.1")
    rp.add_argument("--port", type=int, default=0, help="port for --serve (default: a free one)")
    rp.set_defaults(func=cmd_report)

    tx = sub.add_parser("transplant", parents=[sweep], help="hybrid models from finished runs (layers of one arm "
                        "in another), fine-tuned and added to the tables as derived runs")
    tx.add_argument("--from", dest="source", required=True, metavar="ARM", help="SCHEDULE or SCHEDULE/FREEZE: "
                    "gives the embeddings and the chosen layers")
    tx.add_argument("--into", dest="target", required=True, metavar="ARM", help="gives everything else")
    tx.add_argument("--layers", required=True, help="as a freeze mask: low, mid, high, 0-7, encoder, head, "
                    "comma-separated (the embeddings always come along)")
    tx.add_argument("--task", action="append", help="fine-tuning task (default: the runs' eval tasks)")
    tx.add_argument("--seeds", type=int, nargs="+", help="fine-tuning seeds (default: the runs' eval seeds)")
    tx.set_defaults(func=cmd_transplant)

    t = sub.add_parser("tune", parents=[submit], help="run an Optuna study whose trials are runs (re-run to resume)")
    t.add_argument("tune", help="tune file (YAML)")
    t.add_argument("--storage", help="sqlite (default), journal, or an RDB URL; overrides the file's storage")
    t.set_defaults(func=cmd_tune)

    d = sub.add_parser("dashboard", parents=[results], help="serve optuna-dashboard on a study's storage")
    d.add_argument("study", nargs="?", metavar="STUDY", help="study name or folder (default: the most recent)")
    d.add_argument("--storage", help="storage URL (sqlite:///..., journal:PATH, *.journal, RDB URL)")
    d.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    d.add_argument("--port", type=int, default=8080, help="port (0: any free port)")
    d.set_defaults(func=cmd_dashboard)


def main(argv: list[str] | None = None) -> int:
    from ablate.store.rundir import AlreadyRunning

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except AlreadyRunning as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("interrupted: run folders keep their checkpoints; run the same command again to resume",
              file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
