"""TEMPORARY bridge: the `tune` and `dashboard` subcommands, until the rewritten ablate/cli.py wires them
itself (then delete this file). Argument parsing and exit codes only; the work is in ablate.tune.

May import: anything of ablate except ablate.cli.
"""

from __future__ import annotations

from ablate.config.paths import results_root


def cmd_tune(args) -> int:
    from ablate.launch.executors import require_executor
    from ablate.tune.runner import dry_run_line, run_study
    from ablate.tune.spec import load_tune

    tune = load_tune(args.tune, storage=args.storage)
    executor = require_executor(args.executor or tune.spec.launcher.executor)
    if args.dry_run:
        print(dry_run_line(tune, executor, results_root(args.results)))
        return 0
    counts = run_study(tune, results_root(args.results), executor, poll_s=args.poll)
    return 1 if counts["fail"] else 0


def cmd_dashboard(args) -> int:
    from ablate.tune.dashboard import serve_dashboard
    from ablate.tune.storage import resolve_storage

    url, _ = resolve_storage(args.study, args.storage, args.results)
    return serve_dashboard(url, args.host, args.port)


def add_commands(subparsers) -> None:
    """Register `tune` and `dashboard` on the CLI's subparsers."""
    t = subparsers.add_parser("tune", help="run an Optuna study whose trials are runs (resumes when re-run)")
    t.add_argument("tune", help="tune file (YAML)")
    t.add_argument("--executor", choices=["local", "slurm", "debug"])
    t.add_argument("--storage", help="sqlite (default), journal, or an RDB URL; overrides the file's storage")
    t.add_argument("--results", help="results root (default: $ABLATE_RESULTS or ./results)")
    t.add_argument("--poll", type=float, default=2.0, help="seconds between checks of the jobs")
    t.add_argument("--dry-run", action="store_true", help="check the file, submit nothing")
    t.set_defaults(func=cmd_tune)

    d = subparsers.add_parser("dashboard", help="serve optuna-dashboard on a study's storage")
    d.add_argument("study", nargs="?", help="study name or folder (default: the most recent)")
    d.add_argument("--storage", help="storage URL (sqlite:///..., journal:PATH, *.journal, RDB URL)")
    d.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    d.add_argument("--port", type=int, default=8080, help="port (0: any free port)")
    d.add_argument("--results")
    d.set_defaults(func=cmd_dashboard)
