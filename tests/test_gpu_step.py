"""bench/gpu_step.py, the one GPU check, on this CPU: its tiny run (every row kind: MLM at the grids' 30%,
CLM, with and without documents, ablate and the Trainer recipe), each row's error and the budget reported in
the JSON, and its import path: nothing outside the GPU node's packages (bench/gpu_node_packages.txt) and the
wheels carried to it (bench/gpu_node_wheels.txt)."""

from __future__ import annotations

import importlib.metadata as metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "gpu_step.py"
TINY = ["--allow-cpu", "--tiny", "--seq-lens", "32", "--steps", "1", "--warmup", "1"]

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
    folder = tmp_path_factory.mktemp("gpu_step")
    out, imports = folder / "bench.json", folder / "imports.json"
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
def test_the_tiny_run_times_every_row_kind(tiny_run):
    result, _ = tiny_run
    rows = result["rows"]
    assert all(r["status"] == "ok" and r["tokens_per_s"] > 0 and r["timed_steps"] == 1 for r in rows), rows
    kinds = {("ablate", o, d) for o in ("mlm", "clm") for d in (False, True)} | {
        ("trainer", o, None) for o in ("mlm", "clm")
    }
    assert {(r["recipe"], r["objective"], r["documents"]) for r in rows} == kinds
    assert [(r["recipe"], r["documents"]) for r in rows[:3]] == [
        ("ablate", False),
        ("trainer", None),
        ("ablate", True),
    ]
    assert result["mask_rate"] == 0.3 and all("mfu" in r and "peak_mem_gb" in r for r in rows)


@pytest.mark.slow
def test_a_row_that_fails_is_reported_and_the_json_still_written(tmp_path):
    out = tmp_path / "bench.json"
    # flash_attention_2 needs the flash-attn package (and a GPU): a SpecError or ImportError in every row
    run = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            *TINY,
            "--attn",
            "flash_attention_2",
            "--objectives",
            "mlm",
            "--json",
            str(out),
        ],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 3 and all(r["status"].startswith("error: ") for r in rows), rows


@pytest.mark.slow
def test_rows_that_do_not_fit_the_budget_are_skipped_not_started(tmp_path):
    out = tmp_path / "bench.json"
    run = subprocess.run(
        [sys.executable, str(SCRIPT), *TINY, "--budget-s", "30", "--row-budget-s", "31", "--json", str(out)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert len(result["rows"]) == 6 and all(
        "do not fit in what is left of --budget-s 30" in r["status"] for r in result["rows"]
    )
    assert "not run" in result["headline"] or "skipped" in result["headline"]


@pytest.mark.slow
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
