"""bench/gpu_check.py, the one GPU check, on this CPU: its tiny run (every row kind, the JSON fields each row
must carry, each row warmed on every micro-batch it times and its first-time cost apart, the budget, the
goals), the peak it rates against per device name, the hard limit that stops a row, the corpus-length
documents it packs, and its import path: nothing outside the GPU node's packages (bench/gpu_node_packages.txt)
and the wheels carried to it (bench/gpu_node_wheels.txt)."""

from __future__ import annotations

import importlib.metadata as metadata
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import in_process

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "gpu_check.py"
TINY = ["--allow-cpu", "--tiny", "--steps", "1", "--warmup", "1"]
FIELDS = {
    "recipe", "objective", "seq_len", "micro_batch", "documents", "device", "tokens_per_s", "tflops_executed",
    "peak_memory_gb", "predicted_memory_gb", "memory_compared", "compile_s", "warmup_s", "steps_order",
    "step_s", "peak_tflops", "peak_source", "status",
}  # fmt: skip

# Runs the script with every import made by a module of this repository recorded (import statements and
# importlib.import_module), as {top-level name: the module that imported it}, into argv[1].
RECORD_IMPORTS = r"""
import builtins, importlib, json, runpy, sys
out, script, args = sys.argv[1], sys.argv[2], sys.argv[3:]
repo = script.rsplit("/bench/", 1)[0] + "/"
own = (repo + "ablate/", repo + "bench/")    # the repository's modules (a .venv inside the clone is not)
seen = {}

def note(name, caller):
    if caller.get("__file__", "").startswith(own) and name and not name.startswith("."):
        seen.setdefault(name.split(".")[0], caller.get("__name__"))

plain_import, import_module = builtins.__import__, importlib.import_module

def hooked_import(name, globals=None, locals=None, fromlist=(), level=0):
    if level == 0:
        note(name, globals or {})
    return plain_import(name, globals, locals, fromlist, level)

def hooked_import_module(name, package=None):
    note(name, sys._getframe(1).f_globals)
    return import_module(name, package)

builtins.__import__, importlib.import_module = hooked_import, hooked_import_module
sys.argv = [script, *args]
try:
    runpy.run_path(script, run_name="__main__")
finally:
    json.dump(seen, open(out, "w"))
"""


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """The tiny run, once, with its imports recorded."""
    folder = tmp_path_factory.mktemp("gpu_check")
    out, imports = folder / "check.json", folder / "imports.json"
    run = subprocess.run(
        [sys.executable, "-c", RECORD_IMPORTS, str(imports), str(SCRIPT), *TINY, "--json", str(out)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return json.loads(out.read_text()), json.loads(imports.read_text())


@pytest.mark.slow
def test_the_tiny_run_reports_every_row_in_order_with_its_fields(tiny_run):
    result, _ = tiny_run
    rows = result["rows"]
    assert [r["row"] for r in rows] == sorted(r["row"] for r in rows) and {r["row"] for r in rows} == set(range(8))
    assert all(r["status"] == "ok" or r["status"].startswith("skipped: CUDA") for r in rows), rows
    env = rows[0]
    assert env["sdpa_priority_step"][0] == "cudnn" and env["sdpa_priority_deterministic"][0] == "flash"
    assert env["matmul_tflops"] > 0 and env["torch"] == torch.__version__
    timed = [r for r in rows if "tokens_per_s" in r]
    assert {(r["recipe"], r["objective"], r["seq_len"], r["micro_batch"], r["documents"]) for r in timed} == {
        ("today", "mlm", 64, 4, None),
        ("ablate", "mlm", 64, 4, None),
        ("ablate", "clm", 64, 4, None),
        ("ablate", "mlm", 64, 4, "fixed 16"),
        ("ablate", "mlm", 64, 4, "corpus_en_e3c"),
        ("ablate", "mlm", 64, 8, None),
        ("ablate", "mlm", 64, 16, None),
        ("ablate", "mlm", 32, 8, None),
        ("ablate", "clm", 32, 8, None),
        ("trainer", "mlm", 32, 8, None),
        ("trainer", "mlm", 64, 4, None),
    }
    assert (
        result["peak"]["source"].startswith("measured: row 0") and result["peak"]["tflops"] == env["matmul_tflops"]
    )
    for row in timed:
        assert FIELDS <= row.keys(), FIELDS - row.keys()
        assert row["tokens_per_s_min"] <= row["tokens_per_s"] <= row["tokens_per_s_max"]
        assert 0 < row["executed_flops_per_token"] <= row["nominal_flops_per_token"] * 1.5
        assert row["first_loss"] > 0
        assert (row["predicted_memory_gb"] is not None) == (row["recipe"] == "ablate")
        assert ("eager run" in (row["memory_compared"] or "")) == (
            row["recipe"] == "ablate"
        )  # no compile on a CPU
        # every micro-batch it times was stepped untimed before the first timed step
        order = row["steps_order"]
        first_timed = next(i for i, (phase, _) in enumerate(order) if phase == "timed")
        assert {b for _, b in order[first_timed:]} <= {b for phase, b in order[:first_timed] if phase == "warm"}
        assert all(phase == "timed" for phase, _ in order[first_timed:]), order
        # the first-time cost apart from the step: the warm-up's seconds beyond its steps at the steady time
        steady = len(row["warmup_s"]) * row["step_s"]
        assert row["compile_s"] == pytest.approx(max(sum(row["warmup_s"]) - steady, 0), abs=2e-3)
    corpus = next(r for r in timed if r["documents"] == "corpus_en_e3c")
    assert corpus["documents_per_row"]["min"] >= 1 and "documents_per_row" not in timed[1]
    # the same seed, the same first loss up to the paths' rounding: today's step and the new one
    today, new = (
        next(r for r in timed if r["recipe"] == k and r["micro_batch"] == 4) for k in ("today", "ablate")
    )
    assert today["first_loss"] == pytest.approx(new["first_loss"], abs=2e-3)
    profile = next(r for r in rows if r.get("name") == "baseline profile")
    assert set(profile["seconds_per_step"]) == {"attention", "matmul", "pointwise", "head", "optimizer", "idle"}
    assert profile["seconds_per_step"]["head"] > 0 and profile["seconds_per_step"]["optimizer"] > 0
    banded = next(r for r in rows if r.get("kernel") == "banded local mlm (today)")
    assert banded["max_rel_error_out"] < 1e-5 and max(banded["max_rel_error_grads"]) < 1e-5
    assert banded["fwd_bwd_ms"] > 0
    assert set(result["goals"]) >= {"documents_goal_met", "executed_goal_met", "clm_goal_met", "memory_goal_met"}


@pytest.mark.slow
def test_rows_that_do_not_fit_the_budget_are_skipped_not_started(tmp_path):
    out = tmp_path / "check.json"
    args = [*TINY, "--rows", "1", "3", "--budget-s", "30", "--row-budget-s", "31", "--json", out]
    run = in_process.script(SCRIPT, args, env={"OMP_NUM_THREADS": "1"})  # nothing starts: no process needed
    assert run.returncode == 0, run.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 5 and all("do not fit in the" in r["status"] for r in rows), rows


def _script():
    """bench/gpu_check.py as a module of this process (it puts the checkout and bench/ on sys.path)."""
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    return check, sys.modules["gpu_recipes"]


@pytest.fixture()
def check(monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    return _script()


@pytest.mark.parametrize(
    "name, tflops, source",
    [
        ("NVIDIA H100 80GB HBM3", 989.4, "H100 SXM"),
        ("NVIDIA H100 PCIe", 756.0, "H100 PCIe"),
        ("NVIDIA H200", 989.4, "H200"),
        ("NVIDIA A100-SXM4-40GB", 312.0, "A100"),
        ("NVIDIA A100 80GB PCIe", 312.0, "A100"),
        ("NVIDIA L40S", 362.05, "L40S"),
        ("NVIDIA H100 NVL", 700.0, "measured"),  # no datasheet entry: row 0's rate
        ("NVIDIA GH200 480GB", 700.0, "measured"),
    ],
)
def test_the_peak_is_the_datasheet_s_for_the_device_s_name_else_the_measured_rate(check, name, tflops, source):
    gpu_check, _ = check
    args = gpu_check.parse_args(["--tiny"])
    peak = gpu_check.device_peak(name, args, 700.0)
    assert peak["tflops"] == tflops and source in peak["source"]
    assert gpu_check.device_peak("Some GPU", args, None)["tflops"] is None
    assert gpu_check.device_peak(name, gpu_check.parse_args(["--peak-tflops", "500"]), 700.0)["tflops"] == 500


def test_a_row_past_its_hard_limit_is_stopped_even_inside_code_that_catches_exceptions(check):
    _, recipes = check
    t0 = time.monotonic()
    with pytest.raises(recipes.RowTimeout):
        with recipes.time_limit(0.05):
            try:  # as torch's compile code does around a backend
                time.sleep(5)
            except Exception:
                pass
    assert time.monotonic() - t0 < 1


@pytest.mark.slow
def test_a_row_that_hangs_is_stopped_at_its_limit_and_the_next_rows_still_run(check, monkeypatch, tmp_path):
    gpu_check, _ = check
    monkeypatch.setattr(gpu_check, "GRACE_S", 0.0)
    monkeypatch.setattr(gpu_check, "timed_row", lambda *_a, **_k: time.sleep(30))  # a compile that would not end
    out = tmp_path / "check.json"
    args = [*TINY, "--rows", "3", "--row-budget-s", "0.2", "--budget-s", "60", "--json", str(out)]
    t0 = time.monotonic()
    assert gpu_check.main(args) == 0 and time.monotonic() - t0 < 10
    rows = json.loads(out.read_text())["rows"]
    assert [r["documents"] for r in rows] == [None, None, "fixed 16", "corpus_en_e3c"]
    assert all(r["status"].startswith("stopped: stopped at its hard limit") for r in rows), rows


def test_corpus_documents_are_packed_into_full_rows_with_the_corpus_s_lengths(check):
    _, recipes = check
    docs = recipes.packed_documents(4, 8192, "corpus_en_e3c", seed=1)
    rows = recipes.row_document_lengths(docs)
    assert all(sum(r) == 8192 for r in rows)
    inner = [n for r in rows for n in r[1:-1]]  # the ends of a row may be pieces of a document
    percentiles = recipes.corpus_percentiles("corpus_en_e3c")
    assert statistics.median(inner) == pytest.approx(percentiles[50], rel=0.15)
    assert percentiles[0] <= min(inner) and max(inner) <= percentiles[100]
    assert (docs == recipes.packed_documents(4, 8192, "corpus_en_e3c", seed=1)).all()


def test_without_cuda_the_script_refuses_unless_allowed():
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    refused = subprocess.run(
        [sys.executable, str(SCRIPT)], env=_env(), capture_output=True, text=True, timeout=120
    )
    assert refused.returncode == 2 and "needs a CUDA GPU" in refused.stderr


def _names(file: str) -> set[str]:
    lines = (REPO / "bench" / file).read_text().splitlines()
    return {_canonical(line.split("==")[0]) for line in lines if line.strip() and not line.startswith("#")}


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.mark.slow
def test_the_script_imports_only_what_the_gpu_node_has_or_is_carried_to_it(tiny_run):
    _, imports = tiny_run
    node, carried = _names("gpu_node_packages.txt"), _names("gpu_node_wheels.txt")
    owners = metadata.packages_distributions()
    outside = {}
    for top, importer in imports.items():
        if top in sys.stdlib_module_names or top == "ablate" or (REPO / "bench" / f"{top}.py").exists():
            continue
        dists = {_canonical(d) for d in owners.get(top, [f"<no distribution: {top}>"])}
        for dist in dists - node - carried:
            outside[dist] = f"{top} (imported by {importer})"
    assert not outside, f"not on the GPU node and not carried: {outside}"
    for dist in carried:  # what the carried wheels need is there too
        needs = [r for r in metadata.requires(dist) or [] if "extra ==" not in r]
        missing = {_canonical(re.split(r"[ ;<>=!~\[(]", r)[0]) for r in needs} - node - carried
        assert not missing, f"{dist} needs {missing}"
        assert metadata.version(dist) == _pinned()[dist], f"bench/gpu_node_wheels.txt pins another {dist}"


def _pinned() -> dict[str, str]:
    lines = (REPO / "bench" / "gpu_node_wheels.txt").read_text().splitlines()
    return {_canonical(n): v for n, v in (line.split("==") for line in lines if "==" in line and line[0] != "#")}


@pytest.mark.slow
def test_the_committed_document_lengths_are_what_their_script_computes(data_root):
    """bench/document_lengths.json (what the check packs its corpus rows from, on a node without the data) is
    bench/document_lengths.py's table: recomputed here for corpus_en_craft, its smallest corpus."""
    spec = importlib.util.spec_from_file_location("document_lengths", REPO / "bench" / "document_lengths.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    from ablate.models.loading import load_tokenizer

    tokenizer = load_tokenizer(str(REPO / "bench" / "tokenizer"))
    tokenizer.model_max_length = 10**9
    committed = json.loads(script.TABLE.read_text())["corpora"]
    assert set(committed) == set(script.CORPORA)
    craft = data_root / "corpus_en_craft" / "train.txt"
    assert script.corpus_table(craft, tokenizer) == committed["corpus_en_craft"]
