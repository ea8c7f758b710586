"""How the wall time of a sweep grows with its number of runs, and what the launcher costs per run.

    python bench/sweep_cost.py [--sizes 1 2 4 8] [--executors local debug slurm]

Each sweep is the tiny test grid's CLM-detour arm over N training seeds (tiny random-init BERT, 8 optimizer
steps of 4 x 32 tokens, no probe, no evaluation), so a run's own training time is small and the rest is
the harness: process start, imports, model and data loading, submission and polling. The tokenized corpus
is cached once before the first sweep and shared by every run (as it is between the arms of a real sweep).
Per run: overhead = (sweep wall time - sum of the runs' training time) / N. Prints one JSON line per sweep.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import yaml

REPO = Path(__file__).resolve().parents[1]


def grid(n: int, executor: str) -> dict:
    g = yaml.safe_load((REPO / "tests" / "grids" / "tiny.yaml").read_text())
    g["sweep"] = f"cost-{executor}-{n}"
    g["base"].pop("probe", None)
    g["schedules"] = {
        "clm_detour": [
            {"name": "clm", "objective": "clm", "steps": 6},
            {"name": "mlm_decay", "objective": "mlm", "steps": 2},
        ]
    }
    g["freeze_masks"] = {"none": {}}
    g["axes"] = {"seed": list(range(n))}
    g["exclude"] = []
    g["launcher"] = {
        "executor": executor,
        "local": {"parallel": 1},
        "slurm": {"partition": "cpu", "cpus_per_task": 1, "mem_gb": 3, "timeout_min": 30, "array_parallelism": 2},
    }
    return g


def measure(n: int, executor: str, work: Path, results: str = "r") -> dict:
    path = work / f"{executor}-{n}.yaml"
    path.write_text(yaml.safe_dump(grid(n, executor)))
    start = time.perf_counter()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "ablate.cli",
            "sweep",
            str(path),
            "--results",
            str(work / results),
            "--poll",
            "0.5",
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ),
    )
    wall = time.perf_counter() - start
    if out.returncode != 0:
        raise SystemExit(out.stdout + out.stderr)
    runs = pd.read_parquet(work / results / f"cost-{executor}-{n}" / "runs.parquet")
    train = float(runs["train_time_s"].sum())
    return {
        "executor": executor,
        "runs": n,
        "wall_s": round(wall, 2),
        "train_s_sum": round(train, 2),
        "overhead_per_run_s": round((wall - train) / n, 2),
        "wall_per_run_s": round(wall / n, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument(
        "--executors", nargs="+", default=["debug", "local"] + (["slurm"] if shutil.which("sbatch") else [])
    )
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ablate-sweep-cost-"))
    os.environ.setdefault("ABLATE_CACHE", str(work / "cache"))
    measure(1, "debug", work, results="warm-up")  # fills the tokenization cache shared by all sweeps below
    rows = []
    for executor in args.executors:
        for n in args.sizes:
            rows.append(measure(n, executor, work))
            print(json.dumps(rows[-1]), flush=True)
    print(pd.DataFrame(rows).to_markdown(index=False) if _has_tabulate() else pd.DataFrame(rows).to_string())
    shutil.rmtree(work, ignore_errors=True)


def _has_tabulate() -> bool:
    import importlib.util

    return importlib.util.find_spec("tabulate") is not None


if __name__ == "__main__":
    main()
