"""Shared prefixes trained once (issue 24): a CPU decay grid with three decay lengths, end to end with
branching and with `branching: false`, wall times and their ratio, and a check that both give the same bits.

    python bench/branching.py                  # 12 runs x 2, minutes
    python bench/branching.py --main-steps 10 --seeds 17 --objectives mlm --shares 0.1 0.4 --executor debug
                                               # a check: each sweep's runs in the sweep's process

The grid is grids/decay.yaml's recipe at CPU size: tiny BERT (config:tiny-bert, 4 layers) on the English
corpus slice, a main phase of --main-steps steps (MLM 30 % and the CLM detour, constant LR after one warmup
step), then an MLM decay of 10, 20 and 40 % of the main phase's steps (1-sqrt to 10 % of peak), --seeds, the
layer probe on, no fine-tuning; `ablate sweep` with the local executor (--parallel runs at once; --executor debug for a check). Each variant
runs in a fresh results folder (the corpus cache is shared and prepared first, `ablate prepare`, so neither pays
for it).

Prints a Markdown table (variant, runs, steps trained, wall seconds) and the ratio branched / unbranched; then
compares every run's final weights and token hash across the two variants (they must be equal: exit 1
otherwise); last, one JSON line with every number.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
SHARES = (0.1, 0.2, 0.4)


def grid(
    main_steps: int,
    seeds: list[int],
    branching: bool,
    parallel: int,
    objectives: tuple[str, ...] = ("mlm", "clm"),
    shares: tuple[float, ...] = SHARES,
) -> dict:
    base = yaml.safe_load((REPO / "tests" / "grids" / "tiny.yaml").read_text())["base"]
    base.update(checkpoint_every=10, log_every=10, probe={"n_texts": 8, "max_length": 32})
    base["data"] = {**base["data"], "max_documents": 2000}
    schedules = {}
    for objective in objectives:
        main = {
            "name": "main",
            "objective": objective,
            "steps": main_steps,
            "lr": {"warmup_steps": 1},
            **({"mask_rate": 0.3} if objective == "mlm" else {}),
        }
        for share in shares:
            decay = {
                "name": "mlm_decay",
                "objective": "mlm",
                "mask_rate": 0.15,
                "steps": max(1, round(share * main_steps)),
                "lr": {"decay": "1-sqrt", "final_fraction": 0.1},
            }
            schedules[f"{objective}_d{round(share * 100):02d}"] = [main, decay]
    return {
        "sweep": "bench-branching",
        "base": base,
        "schedules": schedules,
        "axes": {"schedule": list(schedules), "seed": seeds},
        "allow_unequal_compute": True,
        "branching": branching,
        "launcher": {"executor": "local", "local": {"parallel": parallel}},
    }


def sweep(folder: Path, spec: dict, env: dict, executor: str = "local") -> float:
    path = folder / "grid.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    started = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ablate.cli",
            "sweep",
            str(path),
            "--results",
            str(folder / "results"),
            "--executor",
            executor,
            "--poll",
            "0.5",
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"sweep failed in {folder}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return wall


def run_facts(results: Path) -> dict[str, dict]:
    """run id -> final weights digest, token hash, and the steps it trained itself (its curve after its branch)."""
    import hashlib

    out = {}
    for run in sorted((results / "bench-branching" / "runs").iterdir()):
        record = json.loads((run / "records" / "run.json").read_text())
        branch = json.loads((run / "branch.json").read_text()) if (run / "branch.json").is_file() else None
        weights = hashlib.sha256((run / "model" / "model.safetensors").read_bytes()).hexdigest()
        out[run.name] = {
            "weights": weights,
            "token_hash": record["token_hash"],
            "steps": record["steps"],
            "trained": record["steps"] - (branch["step"] if branch else 0),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--main-steps", type=int, default=200)
    ap.add_argument("--seeds", type=int, nargs="+", default=[17, 18])
    ap.add_argument("--parallel", type=int, default=2, help="runs at once (launcher.local.parallel)")
    ap.add_argument(
        "--executor",
        choices=["local", "debug"],
        default="local",
        help="local (measured); debug: each sweep's runs in the sweep's process, one by one (the suite's check)",
    )
    ap.add_argument("--objectives", nargs="+", default=["mlm", "clm"], choices=["mlm", "clm"])
    ap.add_argument(
        "--shares", type=float, nargs="+", default=list(SHARES), help="decay lengths, fractions of the main phase"
    )
    args = ap.parse_args()
    shares = tuple(sorted(args.shares))
    if len({max(1, round(share * args.main_steps)) for share in shares}) < len(shares):
        ap.error(f"--main-steps {args.main_steps}: the decay lengths {shares} of it must differ (10 or more)")
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    with tempfile.TemporaryDirectory(prefix="bench-branching-") as tmp:
        env.setdefault("ABLATE_CACHE", str(Path(tmp) / "cache"))
        to_prepare = Path(tmp) / "prepare.yaml"  # the variants' grid: its corpus is theirs
        to_prepare.write_text(
            yaml.safe_dump(grid(args.main_steps, args.seeds, True, 1, tuple(args.objectives), shares))
        )
        prepared = subprocess.run(
            [sys.executable, "-m", "ablate.cli", "prepare", str(to_prepare)],
            env=env,
            capture_output=True,
            text=True,
        )  # the corpus, tokenized once for both variants
        if prepared.returncode != 0:
            sys.exit(f"ablate prepare failed:\n{prepared.stdout[-3000:]}\n{prepared.stderr[-3000:]}")
        rows, facts = [], {}
        for branching in (True, False):
            folder = Path(tmp) / ("branched" if branching else "unbranched")
            folder.mkdir()
            wall = sweep(
                folder,
                grid(args.main_steps, args.seeds, branching, args.parallel, tuple(args.objectives), shares),
                env,
                args.executor,
            )
            facts[branching] = run_facts(folder / "results")
            rows.append(
                {
                    "variant": "branching" if branching else "branching: false",
                    "runs": len(facts[branching]),
                    "steps trained": sum(f["trained"] for f in facts[branching].values()),
                    "wall s": round(wall, 1),
                }
            )
    print("| variant | runs | steps trained | wall s |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['variant']} | {r['runs']} | {r['steps trained']} | {r['wall s']} |")
    ratio = rows[0]["wall s"] / rows[1]["wall s"]
    steps_ratio = rows[0]["steps trained"] / rows[1]["steps trained"]
    print(f"\nwall time branched / unbranched: {ratio:.2f}x (steps trained: {steps_ratio:.2f}x)")
    same = {
        rid: facts[True][rid]["weights"] == facts[False][rid]["weights"]
        and facts[True][rid]["token_hash"] == facts[False][rid]["token_hash"]
        for rid in facts[False]
    }
    print(f"same final weights and token hash in both variants: {sum(same.values())} of {len(same)} runs")
    print(
        json.dumps(
            {
                "rows": rows,
                "wall_ratio": round(ratio, 3),
                "steps_ratio": round(steps_ratio, 3),
                "same_bits": all(same.values()),
                "main_steps": args.main_steps,
                "seeds": args.seeds,
                "parallel": args.parallel,
                "executor": args.executor,
            }
        )
    )
    if not all(same.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
