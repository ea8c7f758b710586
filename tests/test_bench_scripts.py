"""Every script under bench/ runs at its smallest size: it exits 0 and writes its result (a JSON object as its
last line, or the file it is asked to write), so a benchmark that no longer fits the engine fails here, not
when someone next measures with it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import in_process

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"

# script -> its smallest run (JSON_OUT: a file the test reads back); slow: more than about a minute on 2 cores
TINY = {
    "attention_8192.py": [
        "--seq-len",
        "256",
        "--steps",
        "1",
        "--threads",
        "1",
        "--objectives",
        "clm",
        "--variants",
        "banded",
    ],
    "attention_flops.py": ["--rows", "1"],
    "branching.py": [
        "--main-steps",
        "5",
        "--seeds",
        "17",
        "--objectives",
        "mlm",
        "--parallel",
        "1",
        "--executor",
        "debug",
        "--shares",
        "0.2",
        "0.4",
    ],
    "compare_recipes.py": [
        "--objectives",
        "mlm",
        "--steps",
        "1",
        "--warmup",
        "0",
        "--batch-size",
        "2",
        "--seq-len",
        "32",
        "--quiet-below",
        "0",
        "--retries",
        "0",
        "--json-out",
        "JSON_OUT",
    ],
    "data_scale.py": ["--sizes", "1", "--workers", "1"],
    "finetune_compare.py": [
        "--max-train",
        "16",
        "--max-eval",
        "16",
        "--epochs",
        "1",
        "--seeds",
        "1",
        "--quiet-below",
        "0",
        "--retries",
        "0",
        "--json-out",
        "JSON_OUT",
    ],
    "finetune_gap.py": [  # one variant: the recipe's side runs in finetune_compare.py's tiny run
        "--variants",
        "shuffled",
        "--seeds",
        "1",
        "--max-train",
        "16",
        "--max-eval",
        "16",
        "--epochs",
        "1",
        "--json-out",
        "JSON_OUT",
    ],
    "finetune_memory.py": ["--tasks", "ncbi_disease", "--batch", "2"],
    "finetune_ncbi.py": ["--max-train", "16", "--max-eval", "16", "--epochs", "1"],
    "grid_scale.py": ["--tiny", "--repeat", "1"],
    "pretrain_step.py": [
        "--objective",
        "clm",
        "--steps",
        "1",
        "--warmup",
        "0",
        "--batch-size",
        "2",
        "--seq-len",
        "32",
        "--max-documents",
        "50",
    ],
    "span_ner.py": [
        "--max-train",
        "8",
        "--max-eval",
        "8",
        "--steps",
        "2",
        "--eval-every",
        "2",
        "--batch-size",
        "4",
        "--max-length",
        "32",
        "--json-out",
        "JSON_OUT",
    ],
    "suite_eval.py": [
        "--tasks",
        "ncbi_disease",
        "--seeds",
        "0",
        "--max-train",
        "8",
        "--max-eval",
        "8",
        "--max-length",
        "32",
        "--json-out",
        "JSON_OUT",
    ],
    "sweep_cost.py": ["--sizes", "1", "--executors", "debug"],
    "tokenize_cost.py": ["--size-mb", "1", "--docs", "200", "--rounds", "1"],
    "vocab_head.py": ["--positions", "64", "--vocab", "1000", "--rounds", "2"],
}
FAST: set[str] = set()  # scripts the fast tier (`-m "not slow"`) runs: none (each takes 4-60 s)
# scripts whose tiny run lives elsewhere: gpu_check.py in tests/test_gpu_check.py (gpu_recipes.py is its module),
# gpu_finetune_check.py in tests/test_gpu_finetune_check.py, document_lengths.py (the table gpu_check.py packs its
# corpus rows from) in tests/test_gpu_check.py
ELSEWHERE = {"gpu_check.py", "gpu_recipes.py", "gpu_finetune_check.py", "document_lengths.py"}


def test_every_bench_script_has_a_tiny_run():
    assert {p.name for p in BENCH.glob("*.py")} == set(TINY) | ELSEWHERE


def _last_json(stdout: str) -> dict:
    """The last JSON object the script printed (some print a Markdown table after their JSON lines)."""
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    assert lines, f"the script printed no JSON line:\n{stdout[-2000:]}"
    return json.loads(lines[-1])


@pytest.mark.parametrize("script", [pytest.param(s, marks=pytest.mark.slow) if s not in FAST else s for s in TINY])
def test_a_bench_script_runs_at_its_smallest_size(script, tmp_path, data_root):
    out = tmp_path / "result.json"
    args = [str(out) if a == "JSON_OUT" else a for a in TINY[script]]
    # in this process (its imports paid once); the subprocesses a script starts itself see ROOT on PYTHONPATH
    env = {
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
        "TMPDIR": tmp_path,
    }
    done = in_process.script(BENCH / script, args, cwd=tmp_path, env=env)
    assert done.returncode == 0, (
        f"{script} exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    )
    result = json.loads(out.read_text()) if "JSON_OUT" in TINY[script] else _last_json(done.stdout)
    assert isinstance(result, dict) and result
