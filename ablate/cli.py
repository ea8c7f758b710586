"""The `ablate` command: parse, call, print. Exit codes: 0 ok, 1 some runs failed, 2 bad input."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ablate.config.errors import SpecError


def _print_table(rows: list[dict]) -> None:
    import pandas as pd

    if not rows:
        print("(no runs)")
        return
    with pd.option_context("display.max_colwidth", 120, "display.width", 250):
        print(pd.DataFrame(rows).fillna("").to_string(index=False))


def cmd_run(args) -> int:
    from ablate.store import rundir
    from ablate.launch import worker
    from ablate.evaluate.runs import check_eval
    from ablate.config.paths import results_root
    from ablate.config.spec import load_run_spec

    spec = load_run_spec(args.spec)
    out = Path(args.out) if args.out else results_root() / Path(args.spec).stem / "runs" / spec.run_id
    _validate_against_model(spec, args.spec)
    check_eval([spec], file=str(args.spec))
    worker.prepare_run_dir(spec, out)
    if rundir.read_status(out).get("state") == "failed":
        print(f"{out}: resuming a failed run", file=sys.stderr)
    state = worker.execute(out, stop_after_steps=args.stop_after_steps)
    print(f"{state}: {out}")
    if state == "done":
        print(f"model: {out / 'model'}")
    return 0 if state in ("done", "interrupted") else 1


def _validate_against_model(spec, file) -> None:
    from ablate.models.families import n_layers
    from ablate.models.sources import load_config
    from ablate.plan.phases import plan_phases

    try:
        plan_phases(spec, n_layers(load_config(spec.model)))
    except SpecError as exc:
        raise SpecError(exc.message, file=str(file), key=exc.key, value=exc.value, allowed=exc.allowed) from None


def cmd_sweep(args) -> int:
    from ablate.config.grid import load_grid
    from ablate.plan.grid import expand, plan_table, resolve_layers
    from ablate.config.paths import results_root

    grid = load_grid(args.grid)
    runs = expand(grid, file=str(args.grid))
    plans = resolve_layers(runs, file=str(args.grid))
    from ablate.evaluate.runs import check_eval

    check_eval([r.spec for r in runs], file=str(args.grid))
    executor = args.executor or grid.launcher.executor
    if args.dry_run:
        _print_table(plan_table(runs, plans))
        print(f"{len(runs)} runs; executor {executor}; results in {results_root(args.results) / grid.sweep}; "
              "dry run: nothing submitted")
        return 0
    from ablate.launch import scheduler as launch
    from ablate.store import tables

    if executor == "slurm" and not launch.have_slurm():
        raise SpecError("Slurm is not available here (no sbatch on PATH)", key="launcher.executor", value="slurm",
                        allowed="local, debug")
    by_state = launch.run_sweep(grid, Path(args.grid), runs, results_root(args.results), executor,
                                args.retry_failed, poll_s=args.poll)
    sweep_dir = results_root(args.results) / grid.sweep
    collected = tables.collect(sweep_dir)
    for problem in collected.problems:
        print(f"warning: {problem}", file=sys.stderr)
    done, failed = by_state.get("done", []), by_state.get("failed", [])
    others = {k: v for k, v in by_state.items() if k not in ("done", "failed")}
    print(f"summary: {len(done)} done, {len(failed)} failed"
          + "".join(f", {len(v)} {k}" for k, v in others.items()) + f"; tables in {sweep_dir}")
    for rid in failed:
        print(f"  failed {rid}: log {sweep_dir / 'runs' / rid / 'log.txt'}")
    return 0 if not failed and not others else 1


def _sweep_dir(name: str | None, results: str | None) -> Path:
    from ablate.launch import scheduler as launch
    from ablate.config.paths import results_root

    root = results_root(results)
    if name:
        candidate = Path(name) if Path(name).is_dir() else root / name
        if not (candidate / "runs").is_dir():
            raise SpecError("no such sweep", key="SWEEP", value=name,
                            allowed=", ".join(sorted(p.parent.name for p in root.glob("*/runs"))) or "(none yet)")
        return candidate
    latest = launch.latest_sweep(root)
    if latest is None:
        raise SpecError(f"no sweep under {root}", key="SWEEP")
    return latest


def cmd_status(args) -> int:
    from ablate.launch import scheduler as launch
    from ablate.store import rundir

    sweep_dir = _sweep_dir(args.sweep, args.results)
    manifest = sweep_dir / "sweep.json"
    ids = rundir.read_json(manifest)["run_ids"] if manifest.is_file() else None
    rows = launch.status_rows(launch.SweepPaths(sweep_dir), ids)
    print(f"sweep {sweep_dir.name} ({sweep_dir})")
    _print_table(rows)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["state"]] = counts.get(r["state"], 0) + 1
    print(", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    return 0


def cmd_collect(args) -> int:
    from ablate.store import tables

    sweep_dir = _sweep_dir(args.sweep, args.results)
    collected = tables.collect(sweep_dir)
    for problem in collected.problems:
        print(f"warning: {problem}", file=sys.stderr)
    if getattr(args, "cka_ratio", None):
        _add_cka_ratio(sweep_dir, collected, args.cka_ratio)
    for name, frame in collected.tables.items():
        print(f"{name}: {len(frame)} rows -> {sweep_dir / (name + '.parquet')} (+ .csv)")
    return 0


def cmd_evaluate(args) -> int:
    from ablate.evaluate import runs as evaluate

    overrides = _key_values(args.set, "--set")
    seeds = tuple(args.seeds) if args.seeds else None
    sweep_dir = _sweep_dir(args.sweep, args.results)
    if args.base:
        folder = evaluate.evaluate_base(sweep_dir, args.base, tuple(args.task), seeds or (0,), overrides)
        print(f"base model scores in {folder / 'scores'}")
    if not args.base_only:
        counts = evaluate.evaluate_sweep(sweep_dir, tuple(args.task), seeds, overrides)
        print(f"evaluated {counts['evaluated']} finished runs; {counts['not done']} not finished (skipped)")
    return cmd_collect(args)


def _key_values(pairs: list[str] | None, flag: str) -> dict:
    import yaml

    out = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise SpecError("expected KEY=VALUE", key=flag, value=pair)
        key, value = pair.split("=", 1)
        out[key] = yaml.safe_load(value)
    return out


def cmd_report(args) -> int:
    from ablate.report import figures as report

    if args.figure is None:
        print("figures: " + ", ".join(report.FIGURES))
        return 0
    sweep_dir = _sweep_dir(args.sweep, args.results)
    paths = report.make_figure(args.figure, sweep_dir, args.out, **_key_values(args.set, "--set"))
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    if args.figure == "deltas":
        print(report.score_summary(report.load_sweep(sweep_dir)).to_string(index=False))
    return 0


def _add_cka_ratio(sweep_dir: Path, collected, n_texts: int) -> None:
    """The paper's ratio per layer, (1 - CKA(arm, MLM seed a)) / (1 - CKA(MLM seed b, MLM seed a)), on
    n_texts held-out texts of the sweep's validation corpus; added to the layers table (phase "final")."""
    import pandas as pd

    from ablate.analysis import probe

    from ablate.store import rundir

    from ablate.store import tables
    from ablate.data.corpus import read_documents
    from ablate.config.spec import RunSpec

    runs = collected.tables["runs"]
    done = runs[runs["status"] == "done"] if "status" in runs else runs
    if done.empty:
        raise SpecError("no finished runs to compare", key="--cka-ratio", file=str(sweep_dir))
    spec = RunSpec.model_validate(rundir.read_json(sweep_dir / "runs" / done["run_id"].iloc[0] / "spec.json"))
    if spec.data.valid_corpus is None:
        raise SpecError("the ratio needs held-out texts", key="base.data.valid_corpus", file=str(sweep_dir))
    texts = probe.probe_texts(read_documents(spec.data, "valid_corpus"), n_texts, spec.probe.seed)
    ratio = probe.cka_ratio(done, texts, max_length=spec.probe.max_length)
    if ratio.empty:
        print("cka ratio: the sweep needs at least two MLM-baseline seeds (schedule mlm, freeze none) per model")
        return
    layers = collected.tables["layers"]
    layers = layers[layers["measure"] != probe.RATIO_MEASURE] if "measure" in layers else layers
    collected.tables["layers"] = pd.concat([layers, ratio], ignore_index=True)
    tables.write_tables(sweep_dir, collected.tables)
    print(f"cka ratio: {len(ratio)} rows for {ratio['run_id'].nunique()} runs added to the layers table")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ablate", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="run one RunSpec locally (resumes if interrupted)")
    r.add_argument("spec")
    r.add_argument("--out", help="run folder (default: results/<spec name>/runs/<run id>)")
    r.add_argument("--stop-after-steps", type=int, default=None, help=argparse.SUPPRESS)
    r.set_defaults(func=cmd_run)

    s = sub.add_parser("sweep", help="expand a grid and run it (local, slurm or debug executor)")
    s.add_argument("grid")
    s.add_argument("--executor", choices=["local", "slurm", "debug"])
    s.add_argument("--dry-run", action="store_true", help="print the plan, submit nothing")
    s.add_argument("--retry-failed", action="store_true", help="re-submit runs that failed before")
    s.add_argument("--results", help="results root (default: $ABLATE_RESULTS or ./results)")
    s.add_argument("--poll", type=float, default=5.0, help="seconds between progress checks")
    s.set_defaults(func=cmd_sweep)

    st = sub.add_parser("status", help="per-run state of a sweep (default: the most recent)")
    st.add_argument("sweep", nargs="?")
    st.add_argument("--results")
    st.set_defaults(func=cmd_status)

    c = sub.add_parser("collect", help="merge a sweep's run folders into tidy tables")
    c.add_argument("sweep", nargs="?")
    c.add_argument("--results")
    c.add_argument("--cka-ratio", type=int, metavar="N_TEXTS",
                   help="also compute the paper's CKA ratio vs MLM seed noise on N held-out texts")
    c.set_defaults(func=cmd_collect)

    e = sub.add_parser("evaluate", help="fine-tune finished runs (and optionally the base model) on tasks")
    e.add_argument("sweep", nargs="?")
    e.add_argument("--task", action="append", required=True, help="task name in grids/tasks (repeatable)")
    e.add_argument("--seeds", type=int, nargs="+", help="fine-tuning seeds (default: each run's eval seeds)")
    e.add_argument("--set", action="append", metavar="KEY=VALUE", help="fine-tuning setting override")
    e.add_argument("--base", metavar="MODEL", help="also evaluate this base model as the reference")
    e.add_argument("--base-only", action="store_true", help="only the base model")
    e.add_argument("--results")
    e.set_defaults(func=cmd_evaluate)

    rp = sub.add_parser("report", help="draw a figure from a sweep's tidy tables (PNG + SVG/PDF + CSV)")
    rp.add_argument("--figure", help="layers, deltas, curves, freeze, tune (no value: list them)")
    rp.add_argument("--sweep", help="sweep name or folder (default: the most recent)")
    rp.add_argument("--out", help="output folder, or a file path (.pdf for PDF)")
    rp.add_argument("--set", action="append", metavar="KEY=VALUE", help="figure option, e.g. measure=grad_norm")
    rp.add_argument("--results")
    rp.set_defaults(func=cmd_report)

    from ablate import cli_tune as tune

    tune.add_commands(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
