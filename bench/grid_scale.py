"""The grid engine and the records at scale: a 10,000-run grid, `status` and `collect` over 10,000 run folders.

    .venv/bin/python bench/grid_scale.py                 # build synthetic folders in a temp dir, time, delete
    .venv/bin/python bench/grid_scale.py --keep DIR      # build them in DIR once (or reuse), keep them

Three timings, each the median wall time of --repeat runs (default 3), goals in brackets:
  expand   load + validate a grid file of 4 schedules x 5 freeze masks x 25 seeds x 20 lrs = 10,000 runs
           into RunSpecs with their run ids (ablate.plan.grid.load_grid + expand)               [< 2 s]
  status   ablate.launch.scheduler.status_rows over the sweep's 10,000 run ids                        [< 2 s]
  collect  ablate.store.collect.collect over 10,000 run folders, writing the six tidy tables as parquet and
           csv, as `ablate collect` does                                                    [< 10 s]
Also reported, without a goal: `resolve` (ablate.plan.grid.resolve_layers: every run's freeze masks against its
model's depth, which `sweep --dry-run` adds to expand), and collect without writing the collect.

The folders hold what a finished run writes, through the real writers (rundir.write_status,
rundir.write_records, atomic.write_json): spec.json of the expanded run, status.json, run.json, 100 curve
rows, 100 grad-norm rows, 3 phases x 8 layers x 3 measures of layer rows, 31 frozen rows, 3 score files
(task x seed) of 4 rows. 9,000 are done, 500 failed, 500 say "running" with nobody holding their lock (shown
as interrupted, which costs a lock probe each). fsync is skipped while building them (setup only: 80,000
fsyncs take minutes on this disk and do not change what is read back); nothing is skipped while timing.

The last line printed is one JSON object: the wall times in seconds, the same calls' CPU time (cpu_s: this
process's, which other work on a shared machine does not inflate), the 1-minute load average before and
after, the states and row counts, and the goals. The exit status is 0 when every goal is met.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

from ablate.store import atomic

from ablate.launch import scheduler as launch

from ablate.store import rundir

from ablate.store import collect
from ablate.store.sweep import SweepFolder
from ablate.config.grid import load_grid
from ablate.plan.grid import expand, resolve_layers
from ablate.config.spec import dump_run_spec

GOALS_S = {"expand": 2.0, "status": 2.0, "collect": 10.0}
N_SCHEDULES, N_MASKS, N_SEEDS, N_LRS = 4, 5, 25, 20


def grid_text() -> str:
    """4 schedules, each with a 'main' phase that the 5 freeze masks act on: every combination is valid."""
    objectives = ["mlm", "clm", "mlm", "clm"]
    lines = [
        "sweep: scale",
        "base:",
        "  model: hub:answerdotai/ModernBERT-base",
        "  tokenizer: hub:answerdotai/ModernBERT-base",
        "  data: {corpus: corpus_en_e3c/train.txt, valid_corpus: corpus_en_e3c/valid.txt, seq_len: 128}",
        "  batch_size: 32",
        "  budget_tokens: 10000000",
        "  probe: {n_texts: 64}",
        "  eval: {tasks: [ncbi_disease, bc5cdr, chemprot], seeds: [0]}",
        "prelude:",
        "  - {name: head_warmup, objective: mlm, steps: 50, freeze: encoder, lr: {peak_lr: 1.0e-3}}",
        "schedules:",
    ]
    for i, obj in enumerate(objectives):
        lines += [
            f"  s{i}:",
            f"    - {{name: main, objective: {obj}, fraction: {0.5 + 0.1 * i:.1f}, lr: {{warmup_steps: 100}}}}",
            f"    - {{name: decay, objective: mlm, fraction: {0.5 - 0.1 * i:.1f}, "
            "lr: {decay: 1-sqrt, final_fraction: 0.1}}",
        ]
    lines += [
        "freeze_masks:",
        "  none: {}",
        "  low: {main: low}",
        "  mid: {main: mid}",
        "  high: {main: high}",
        "  low_mid: {main: [low, mid]}",
        "axes:",
        f"  schedule: [{', '.join(f's{i}' for i in range(N_SCHEDULES))}]",
        "  freeze: [none, low, mid, high, low_mid]",
        f"  seed: [{', '.join(str(s) for s in range(N_SEEDS))}]",
        f"  optim.lr: [{', '.join(f'{(k + 1) * 1.0e-5:.1e}' for k in range(N_LRS))}]",
        "launcher: {executor: slurm}",
    ]
    return "\n".join(lines) + "\n"


CPU_S: dict[str, float] = {}


def timed(fn, repeat: int, name: str):
    """Median wall time of `repeat` calls (and, in CPU_S, the median CPU time of this process)."""
    times, cpu, result = [], [], None
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        result = fn()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    CPU_S[name] = round(statistics.median(cpu), 3)
    return statistics.median(times), result


@contextmanager
def no_fsync():
    with mock.patch("os.fsync", lambda fd: None):
        yield


def write_synthetic(sweep_dir: Path, runs) -> dict[str, int]:
    """One folder per run, as a finished (or failed, or interrupted) run leaves it."""
    phases = ["head_warmup", "main", "decay"]
    counts = {"done": 0, "failed": 0, "running": 0}
    with no_fsync():
        for k, run in enumerate(runs):
            run_dir = sweep_dir / "runs" / run.run_id
            atomic.write_json(run_dir / "spec.json", dump_run_spec(run.spec))
            if k % 20 == 1:
                rundir.write_status(run_dir, "running", attempts=1, started=time.time() - 60, pid=1)
                counts["running"] += 1
                continue
            if k % 20 == 2:
                rundir.write_status(run_dir, "running", attempts=1, started=time.time() - 60)
                rundir.write_status(
                    run_dir,
                    "failed",
                    error="Traceback (most recent call last):\n  ...\nRuntimeError: CUDA out of memory",
                )
                counts["failed"] += 1
                continue
            rundir.write_status(run_dir, "running", attempts=1, started=time.time() - 600)
            curves = [
                {
                    "phase": phases[min(s // 34, 2)],
                    "step": s,
                    "tokens": s * 4096,
                    "loss": 9.0 / (1 + s / 10) + k * 1e-6,
                    "lr": 1e-4 * (1 - s / 100),
                }
                for s in range(100)
            ]
            grads = [
                {
                    "phase": phases[min(s // 34, 2)],
                    "step": s // 8 * 10,
                    "layer": s % 8 - 1,
                    "grad_norm": 0.5 + s * 1e-3,
                }
                for s in range(100)
            ]
            layers = [
                {"phase": p, "layer": layer, "measure": m, "value": 1.0 - layer * 0.01}
                for p in phases
                for layer in range(-1, 7)
                for m in ("cka_vs_base", "weight_rel_change", "grad_norm")
            ]
            run_rec = {
                "token_hash": f"{k:064x}",
                "tokens_seen": 409600,
                "phase_token_hashes": {p: "ab" * 32 for p in phases},
                "phase_tokens": {p: 136533 for p in phases},
                "steps": 100,
                "train_time_s": 512.25,
                "wall_time_s": 600.5,
                "n_layers": 22,
                "model_dir": str(run_dir / "model"),
                "versions": json.dumps(
                    {
                        "ablate": "0.1.0",
                        "torch": "2.5.1",
                        "transformers": "4.57.0",
                        "python": platform.python_version(),
                    }
                ),
            }
            frozen = [{"phase": "head_warmup", "layer": layer} for layer in range(-1, 22)] + [
                {"phase": "main", "layer": layer} for layer in range(8)
            ]
            rundir.write_records(run_dir, run_rec, curves, grads, layers, frozen)
            for task in ("ncbi_disease", "bc5cdr", "chemprot"):
                rows = [
                    {
                        "task": task,
                        "language": "en",
                        "finetune_seed": 0,
                        "split": split,
                        "metric": m,
                        "value": 0.8 + k * 1e-6,
                        "epoch": 3,
                        "wall_time_s": 100.0,
                    }
                    for split in ("dev", "test")
                    for m in ("f1", "precision")
                ]
                atomic.write_json(
                    run_dir / "scores" / task / "seed-0.json",
                    {
                        "task": task,
                        "seed": 0,
                        "model_dir": str(run_dir / "model"),
                        "settings": {"epochs": 3, "lr": 5e-5},
                        "rows": rows,
                    },
                )
            rundir.write_status(run_dir, "done", finished=time.time(), wall_time_s=600.5)
            counts["done"] += 1
    atomic.write_json(sweep_dir / "sweep.json", {"sweep": "scale", "run_ids": [r.run_id for r in runs]})
    return counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keep", metavar="DIR", help="build the synthetic sweep in DIR (reused when already there)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tiny", action="store_true", help="1 seed x 1 lr: 20 runs (a check that it runs)")
    args = ap.parse_args(argv)
    if args.tiny:
        global N_SEEDS, N_LRS
        N_SEEDS, N_LRS = 1, 1

    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="ablate-grid-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        grid_file = work / "scale.yaml"
        grid_file.write_text(grid_text())

        def do_expand():
            return expand(load_grid(grid_file), file=str(grid_file))

        load_before = os.getloadavg()[0]
        t_expand, runs = timed(do_expand, args.repeat, "expand")
        assert len(runs) == N_SCHEDULES * N_MASKS * N_SEEDS * N_LRS, len(runs)
        ids = [r.run_id for r in runs]
        t_resolve, plans = timed(lambda: resolve_layers(runs, file=str(grid_file)), args.repeat, "resolve")
        assert len(plans) == len(runs)

        sweep_dir = work / "scale"
        marker = sweep_dir / "sweep.json"
        if not (marker.is_file() and rundir.read_json(marker)["run_ids"] == ids):
            shutil.rmtree(sweep_dir, ignore_errors=True)
            t0 = time.perf_counter()
            counts = write_synthetic(sweep_dir, runs)
            print(f"built {len(runs)} run folders in {time.perf_counter() - t0:.1f} s: {counts}", file=sys.stderr)

        paths = SweepFolder(sweep_dir)
        t_status, rows = timed(lambda: launch.status_rows(paths, ids), args.repeat, "status")
        states = {}
        for r in rows:
            states[r["state"]] = states.get(r["state"], 0) + 1
        t_collect_read, _ = timed(lambda: collect.collect(sweep_dir, write=False), args.repeat, "collect_no_write")
        t_collect, collected = timed(lambda: collect.collect(sweep_dir), args.repeat, "collect")
        assert not collected.problems, collected.problems[:3]

        result = {
            "bench": "grid_scale",
            "runs": len(runs),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "expand_s": round(t_expand, 3),
            "resolve_s": round(t_resolve, 3),
            "status_s": round(t_status, 3),
            "collect_s": round(t_collect, 3),
            "collect_no_write_s": round(t_collect_read, 3),
            "cpu_s": CPU_S,
            "load_avg_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            "states": states,
            "rows": {name: len(frame) for name, frame in collected.tables.items()},
            "goals_s": GOALS_S,
            "met": {
                "expand": t_expand < GOALS_S["expand"],
                "status": t_status < GOALS_S["status"],
                "collect": t_collect < GOALS_S["collect"],
            },
        }
        print(json.dumps(result))
        return 0 if all(result["met"].values()) else 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
