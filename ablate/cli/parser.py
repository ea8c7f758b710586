"""The `ablate` command line: its subcommands, their arguments and help.

May import: config, cli.
"""

from __future__ import annotations

import argparse
from typing import get_args

from ablate.cli.commands import (
    POLL_S,
    cmd_calibrate,
    cmd_collect,
    cmd_dashboard,
    cmd_evaluate,
    cmd_export,
    cmd_grids,
    cmd_prepare,
    cmd_report,
    cmd_run,
    cmd_status,
    cmd_sweep,
    cmd_transplant,
    cmd_tune,
)
from ablate.cli.data_commands import add_data_commands
from ablate.config.paths import given_or_shipped

DESCRIPTION = "ablate: layer-freezing ablations of encoder continued pretraining."


def _executors() -> tuple[str, ...]:
    from ablate.config.launcher import Launcher

    return get_args(Launcher.model_fields["executor"].annotation)


def build_parser() -> argparse.ArgumentParser:
    results = argparse.ArgumentParser(add_help=False)
    results.add_argument("--results", help="results root (default: $ABLATE_RESULTS or ./results)")
    sweep = argparse.ArgumentParser(add_help=False, parents=[results])
    sweep.add_argument("sweep", nargs="?", metavar="SWEEP", help="sweep name or folder (default: the most recent)")
    submit = argparse.ArgumentParser(add_help=False, parents=[results])
    submit.add_argument("--executor", choices=_executors(), help="overrides the file's launcher.executor")
    submit.add_argument(
        "--poll",
        type=float,
        default=POLL_S,
        help=f"most seconds between progress checks ({POLL_S:g}; a sweep looks sooner after a run starts or ends)",
    )
    submit.add_argument("--dry-run", action="store_true", help="check and print the plan, submit nothing")

    p = argparse.ArgumentParser(
        prog="ablate",
        description=DESCRIPTION,
        epilog="Exit codes: 0 ok, 1 runs failed or records unreadable, 2 bad input.",
    )
    sub = p.add_subparsers(dest="command", required=True)
    _add_run_commands(sub, results, sweep, submit)
    _add_analysis_commands(sub, results, sweep, submit)
    _add_export_command(sub, sweep)
    add_data_commands(sub)
    return p


def _add_run_commands(sub, results, sweep, submit) -> None:
    r = sub.add_parser("run", parents=[results], help="run one RunSpec in this process (resumes if interrupted)")
    r.add_argument("spec", type=given_or_shipped, help="run spec (YAML)")
    r.add_argument("--out", help="run folder (default: <results>/<spec name>/runs/<run id>)")
    r.add_argument(
        "--stop-after-steps",
        type=int,
        default=None,
        help="stop (with a checkpoint) after this many optimizer steps; re-run to resume",
    )
    r.set_defaults(func=cmd_run)

    s = sub.add_parser("sweep", parents=[submit], help="expand a grid and run it (local, slurm or debug executor)")
    s.add_argument("grid", type=given_or_shipped, help="grid file (YAML; grids/NAME.yaml: `ablate grids`)")
    s.add_argument("--retry-failed", action="store_true", help="re-submit runs that failed before")
    s.add_argument(
        "--wait",
        action="store_true",
        help="runs another live driver, worker or job holds: wait until "
        "they end, then submit any left unfinished (default: leave them to it and exit 0)",
    )
    s.add_argument(
        "--tokens-per-s",
        type=float,
        metavar="N",
        help="with --dry-run: training tokens/s of one "
        "process (one GPU), for the cost plan's hours (default: the sweep's `ablate calibrate`)",
    )
    s.set_defaults(func=cmd_sweep)

    g = sub.add_parser(
        "grids",
        help="the grids, tasks and suites shipped with ablate, and where they are (grids/NAME.yaml names one "
        "from any folder)",
    )
    g.set_defaults(func=cmd_grids)

    cb = sub.add_parser(
        "calibrate",
        parents=[results],
        help="time a few steps of each distinct model / objective "
        "/ length / batch of a grid here and store the throughput with the sweep (the cost plan)",
    )
    cb.add_argument("grid", type=given_or_shipped, help="grid file (YAML)")
    cb.add_argument("--steps", type=int, default=3, help="timed steps of each combination (default 3)")
    cb.add_argument("--warmup", type=int, default=2, help="untimed steps before them (default 2)")
    cb.add_argument("--no-finetune", action="store_true", help="do not time the grid's fine-tuning")
    cb.set_defaults(func=cmd_calibrate)

    pr = sub.add_parser("prepare", help="tokenize corpora once into memory-mapped shards (where runs read them)")
    pr.add_argument(
        "target", type=given_or_shipped, help="a grid, a run spec, or a corpus path (file, glob or folder)"
    )
    pr.add_argument("--workers", type=int, help="tokenizer processes (default: the cores this process may use)")
    pr.add_argument("--tokenizer", help="tokenizer (same forms as a run spec's model); default: the spec's")
    pr.add_argument(
        "--verify",
        action="store_true",
        help="re-hash every prepared file and source against the manifest (exit 2 on a mismatch)",
    )
    pr.add_argument("--shard-tokens", type=int, help="tokens per shard file (default 2**28)")
    pr.set_defaults(func=cmd_prepare)

    st = sub.add_parser(
        "status",
        parents=[sweep],
        help="per-run state of a sweep (and the cost estimate against what finished runs took)",
    )
    st.add_argument(
        "--tokens-per-s",
        type=float,
        metavar="N",
        help="estimate with this throughput instead of the sweep's calibration",
    )
    st.set_defaults(func=cmd_status)

    c = sub.add_parser("collect", parents=[sweep], help="merge a sweep's run folders into tidy tables")
    c.add_argument(
        "--cka-ratio",
        type=int,
        metavar="N_TEXTS",
        help="also compute the paper's CKA ratio vs MLM seed noise on N held-out texts",
    )
    c.add_argument(
        "--pairs",
        action="store_true",
        help="also write the pairs table: CKA per layer and phase end between twin arms and MLM seeds",
    )
    c.set_defaults(func=cmd_collect)

    e = sub.add_parser("evaluate", parents=[sweep], help="fine-tune finished runs (and the base model) on tasks")
    e.add_argument(
        "--task",
        action="append",
        default=[],
        help="task name in grids/tasks, or suite:NAME of grids/suites (repeatable)",
    )
    e.add_argument(
        "--suite",
        action="append",
        default=[],
        metavar="NAME",
        help="a suite of grids/suites: the same as --task suite:NAME (repeatable); its tasks "
        "whose data the data root lacks are skipped and named with how to get them",
    )
    e.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        help="fine-tuning seeds (default: each run's eval seeds; a suite's tasks, the suite's)",
    )
    e.add_argument("--set", action="append", metavar="KEY=VALUE", help="fine-tuning setting override")
    e.add_argument("--base", metavar="MODEL", help="also evaluate this base model as the reference")
    e.add_argument(
        "--base-only",
        action="store_true",
        help="only the base model (with no SWEEP and none "
        "under the results root: its scores go to <results>/base/NAME)",
    )
    e.add_argument(
        "--protocol",
        metavar="NAME",
        help="fine-tuning profile over the task files: paper or smoke "
        "(default: each run's eval.protocol, else the task files)",
    )
    e.add_argument(
        "--keep-stale",
        action="store_true",
        help="keep scores whose task file, data or settings changed (marked stale) instead of recomputing them",
    )
    e.set_defaults(func=cmd_evaluate)


def _add_analysis_commands(sub, results, sweep, submit) -> None:
    rp = sub.add_parser(
        "report", parents=[sweep], help="draw a figure from a sweep's tidy tables (PNG + SVG/PDF + CSV)"
    )
    rp.add_argument(
        "--figure",
        nargs="?",
        const="",
        help="layers, deltas, curves, freeze, tune, divergence, regions, persistence, needle (no value: list them)",
    )
    rp.add_argument(
        "--table",
        help="scores, freeze, divergence or transplant: the paper's results tables (CSV + Markdown + LaTeX)",
    )
    rp.add_argument(
        "--baseline", help="the arm everything is compared with (default: the mlm schedule, no freezing)"
    )
    rp.add_argument(
        "--reference",
        metavar="NAME",
        help="with --table scores|freeze (or --html): the published "
        "numbers beside the measured ones: paper (the CLM-detour paper's tables)",
    )
    rp.add_argument("--out", help="output folder, or a file path (.pdf for PDF)")
    rp.add_argument("--set", action="append", metavar="KEY=VALUE", help="figure option, e.g. measure=grad_norm")
    rp.add_argument(
        "--html",
        action="store_true",
        help="one self-contained page of the sweep: <sweep>/report.html (or --out PATH); re-run to refresh it",
    )
    rp.add_argument("--serve", action="store_true", help="write the page, then serve it on 127.0.0.1")
    rp.add_argument("--port", type=int, default=0, help="port for --serve (default: a free one)")
    rp.set_defaults(func=cmd_report)

    tx = sub.add_parser(
        "transplant",
        parents=[sweep],
        help="hybrid models from finished runs (layers of one arm "
        "in another), fine-tuned and added to the tables as derived runs",
    )
    tx.add_argument(
        "--from",
        dest="source",
        required=True,
        metavar="ARM",
        help="SCHEDULE or SCHEDULE/FREEZE: gives the chosen layers",
    )
    tx.add_argument("--into", dest="target", required=True, metavar="ARM", help="gives everything else")
    tx.add_argument(
        "--layers",
        help="as a freeze mask: low, mid, high, 0-7, encoder, head, comma-separated; with --components: the "
        "blocks they come from (default all)",
    )
    tx.add_argument("--components", help="attention, mlp (comma-separated): only these parts of each block")
    tx.add_argument(
        "--embeddings",
        action="store_true",
        help="copy the --from run's embeddings too (the paper's transplants copy the layers alone)",
    )
    tx.add_argument("--task", action="append", help="fine-tuning task (default: the runs' eval tasks)")
    tx.add_argument("--seeds", type=int, nargs="+", help="fine-tuning seeds (default: the runs' eval seeds)")
    tx.set_defaults(func=cmd_transplant)

    t = sub.add_parser(
        "tune", parents=[submit], help="run an Optuna study whose trials are runs (re-run to resume)"
    )
    t.add_argument("tune", type=given_or_shipped, help="tune file (YAML)")
    t.add_argument("--storage", help="sqlite (default), journal, or an RDB URL; overrides the file's storage")
    t.set_defaults(func=cmd_tune)

    d = sub.add_parser("dashboard", parents=[results], help="serve optuna-dashboard on a study's storage")
    d.add_argument("study", nargs="?", metavar="STUDY", help="study name or folder (default: the most recent)")
    d.add_argument("--storage", help="storage URL (sqlite:///..., journal:PATH, *.journal, RDB URL)")
    d.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    d.add_argument("--port", type=int, default=8080, help="port (0: any free port)")
    d.set_defaults(func=cmd_dashboard)


def _add_export_command(sub, sweep) -> None:
    x = sub.add_parser(
        "export",
        parents=[sweep],
        help="one finished run as a Hugging Face folder (weights, "
        "tokenizer, config, a model card from its records), optionally pushed to a hub",
    )
    x.add_argument(
        "run_or_arm",
        metavar="RUN_OR_ARM",
        help="a run id, or an arm as the tables name it: SCHEDULE or "
        "'SCHEDULE, freeze MASK' (also SCHEDULE/MASK); an arm exports its lowest seed unless --seed",
    )
    x.add_argument("--out", required=True, metavar="DIR", help="the folder to write (new or empty; see --force)")
    x.add_argument(
        "--seed", type=int, help="the pretraining seed of the arm's run to export (default: the lowest)"
    )
    x.add_argument("--bf16", action="store_true", help="cast the weights to bfloat16 (as the paper released them)")
    x.add_argument("--force", action="store_true", help="replace a non-empty --out whole")
    x.add_argument(
        "--baseline",
        help="the arm the card's scores are compared with (default: the mlm schedule, "
        "no freezing; as `report --table scores`)",
    )
    x.add_argument(
        "--push-to-hub",
        metavar="ORG/NAME",
        help="then upload the folder to this hub model repository "
        "(needs a token: HF_TOKEN or `hf auth login`; HF_ENDPOINT for another hub)",
    )
    x.set_defaults(func=cmd_export)
