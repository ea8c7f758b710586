"""bench/gpu_finetune_check.py, the fine-tuning GPU check, on this CPU: its tiny run (every row, the JSON fields
each row must carry, both paths warmed on every batch before any is timed and taken in alternating order,
their first-time cost apart, the units sharing the device, the plan and the goals), its budget, its refusal
without CUDA, its import path (nothing outside the GPU node's packages and the carried wheels), and the
length deciles it draws sentences from (those of the data)."""

from __future__ import annotations

import dataclasses
import importlib.metadata as metadata
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import in_process

from test_gpu_check import RECORD_IMPORTS, _canonical, _names

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "gpu_finetune_check.py"
TINY = ["--allow-cpu", "--tiny", "--steps", "2", "--warmup", "1", "--unit-s", "0.5"]
TYPES = {
    1: ("sequence_classification", 128, 4),
    2: ("multi_label_classification", 256, 4),
    3: ("span_ner", 64, 16),
    4: ("token_classification", 32, 16),
}
FIELDS = {
    "type", "task", "path", "seq_len", "batch", "lengths", "device", "timed_steps", "examples_per_s",
    "examples_per_s_min", "examples_per_s_max", "examples_per_s_mean", "tokens_per_s_mean", "padding_share",
    "peak_memory_gb", "first_loss", "varlen_calls_first_step", "compile_s", "warmup_s", "steps_order", "status",
}  # fmt: skip


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """The tiny run, once, with its imports recorded."""
    folder = tmp_path_factory.mktemp("gpu_finetune_check")
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
def test_the_tiny_run_reports_every_type_on_both_paths_with_its_fields(tiny_run):
    result, _ = tiny_run
    rows = result["rows"]
    assert [r["row"] for r in rows] == [0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6]
    assert all(r["status"] == "ok" for r in rows), [r for r in rows if r["status"] != "ok"]
    assert rows[0]["torch"] == torch.__version__
    typed = [r for r in rows if r["name"] == "type"]
    assert [(r["row"], r["path"]) for r in typed] == [(n, p) for n in TYPES for p in ("today", "new")]
    for row in typed:
        assert FIELDS <= row.keys(), FIELDS - row.keys()
        assert (row["type"], row["seq_len"], row["batch"]) == TYPES[row["row"]]
        assert row["timed_steps"] == 2 and row["examples_per_s_min"] <= row["examples_per_s"]
        assert row["examples_per_s"] <= row["examples_per_s_max"] and row["examples_per_s_mean"] > 0
        assert 0 <= row["padding_share"] < 1 and row["first_loss"] > 0
        assert row["varlen_calls_first_step"] == 0  # the CPU keeps transformers' attention on both paths
    for today, new in zip(typed[::2], typed[1::2]):
        # the same weights and batches: on the CPU the two paths compute the same step
        assert new["first_loss"] == today["first_loss"], (today, new)
        order = today["steps_order"]
        assert order == new["steps_order"]  # the two paths of a type were stepped in turns, on one model
        first_timed = next(i for i, step in enumerate(order) if step[0] == "timed")
        warmed = {(path, batch) for phase, path, batch in order[:first_timed] if phase == "warm"}
        assert {(path, batch) for _, path, batch in order[first_timed:]} <= warmed
        assert all(step[0] == "timed" for step in order[first_timed:])
        firsts = [path for _, path, _ in order[first_timed::2]]
        assert firsts == ["today", "new"][: len(firsts)]  # which path goes first swaps from one step to the next
        for row in (today, new):
            assert row["compile_s"] is not None and 0 <= row["compile_s"] <= sum(row["warmup_s"])
        assert new["new_over_today"] == pytest.approx(
            new["examples_per_s_mean"] / today["examples_per_s_mean"], 1e-2
        )
    assert "deciles" in typed[4]["lengths"] and "uniform" in typed[0]["lengths"]


@pytest.mark.slow
def test_the_tiny_run_shares_the_device_among_unit_processes_and_plans_from_the_rows(tiny_run):
    result, _ = tiny_run
    units = [r for r in result["rows"] if r["name"] == "units"]
    assert [r["units"] for r in units] == [1, 2]
    for row in units:
        assert len(row["examples_per_s_each"]) == row["units"] == len(row["steps_each"])
        assert all(steps > 0 for steps in row["steps_each"]) and row["examples_per_s_total"] > 0
    assert units[0]["over_fewest"] == 1.0 and units[0]["startup_s"] > 0
    plan = next(r for r in result["rows"] if r["name"] == "plan")
    assert set(plan["per_type"]) == {t for t, _, _ in TYPES.values()}
    spans = plan["per_type"]["span_ner"]
    assert spans["train_examples_per_unit"] == 4000 * 16  # quaero_emea_spans: max_steps x batch_size
    assert spans["new_gpu_h_per_unit"] == pytest.approx(spans["new_s_per_1k"] * 64 / 3600, abs=1e-4)
    goals = result["goals"]
    assert goals["goal"] == 3.0 and goals["best_units"] in (1, 2)
    assert goals["units_type"] == "span_ner"  # the freeze grid's span-model units, bf16 on CUDA
    row = next(n for n, (kind, _, _) in TYPES.items() if kind == goals["units_type"])
    today = next(r for r in result["rows"] if r["name"] == "type" and r["row"] == row and r["path"] == "today")
    best = max(r["examples_per_s_total"] for r in units)
    assert goals["gpu_seconds_gain_per_unit"] == pytest.approx(best / today["examples_per_s_mean"], 1e-2)


@pytest.mark.slow
def test_rows_that_do_not_fit_the_budget_are_skipped_not_started(tmp_path):
    out = tmp_path / "check.json"
    args = [*TINY, "--rows", "1", "5", "--budget-s", "30", "--row-budget-s", "31", "--json", out]
    run = in_process.script(SCRIPT, args, env={"OMP_NUM_THREADS": "1"})  # nothing starts: no process needed
    assert run.returncode == 0, run.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["row"], r.get("path"), r.get("units")) for r in rows] == [
        (1, "today", None), (1, "new", None), (5, None, 1), (5, None, 2)
    ]  # fmt: skip
    assert all("do not fit in the" in r["status"] for r in rows), rows


def test_without_cuda_the_script_refuses_unless_allowed():
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    refused = subprocess.run(
        [sys.executable, str(SCRIPT)], env=_env(), capture_output=True, text=True, timeout=120
    )
    assert refused.returncode == 2 and "needs a CUDA GPU" in refused.stderr


@pytest.mark.slow
def test_the_script_imports_only_what_the_gpu_node_has_or_is_carried_to_it(tiny_run):
    _, imports = tiny_run
    node, carried = _names("gpu_node_packages.txt"), _names("gpu_node_wheels.txt")
    owners = metadata.packages_distributions()
    outside = {}
    for top, importer in imports.items():
        if top in sys.stdlib_module_names or top == "ablate" or (REPO / "bench" / f"{top}.py").exists():
            continue
        for dist in {_canonical(d) for d in owners.get(top, [f"<no distribution: {top}>"])} - node - carried:
            outside[dist] = f"{top} (imported by {importer})"
    assert not outside, f"not on the GPU node and not carried: {outside}"


def _script(monkeypatch):
    """The script as a module of this process (its sys.path changes undone after the test)."""
    monkeypatch.setattr(sys, "path", list(sys.path))  # the script puts the checkout and bench/ first
    spec = importlib.util.spec_from_file_location("gpu_finetune_check", SCRIPT)
    check = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, check)  # its dataclasses resolve their module's names
    spec.loader.exec_module(check)
    return check


@pytest.mark.slow
def test_on_cuda_s_kernels_the_new_rows_run_flash_varlen_from_today_s_first_loss(monkeypatch):
    """What the GPU rows compare, on the CPU: CUDA's kernels, the flash varlen op computed by its reference
    (tests/varlen_reference.py), the loop's bf16 switch on (the CPU still computes in float32)."""
    import varlen_reference
    from ablate.models import attention
    from ablate.models.loading import load_tokenizer

    check = _script(monkeypatch)
    varlen_reference.register()
    monkeypatch.setattr(attention, "kernels_for", lambda _device: attention.GPU_KERNELS)
    built = check.build_unit
    monkeypatch.setattr(check, "build_unit", lambda *a, **k: dataclasses.replace(built(*a, **k), bf16=True))
    args = check.parse_args(["--allow-cpu", "--tiny", "--steps", "1", "--warmup", "1"])
    tokenizer = load_tokenizer(args.tokenizer)
    for kind in check.TYPE_ROWS:
        today, new = check.type_rows(args, kind, tokenizer, torch.device("cpu"), 600)
        assert today["varlen_calls_first_step"] == 0, kind
        assert new["varlen_calls_first_step"] == 4, kind  # tiny ModernBERT's 4 layers, each through flash varlen
        assert new["first_loss"] == pytest.approx(today["first_loss"], rel=1e-4), kind


def test_the_sentence_lengths_it_draws_are_the_data_deciles(data_root, monkeypatch):
    check = _script(monkeypatch)
    from ablate.models.loading import load_tokenizer

    tokenizer = load_tokenizer(check.DEFAULT_TOKENIZER)
    assert check.length_deciles("quaero_emea_spans", data_root, tokenizer) == check.QUAERO_SPANS_DECILES
    assert check.length_deciles("ncbi_disease", data_root, tokenizer) == check.NCBI_DISEASE_DECILES
