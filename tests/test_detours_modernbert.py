"""grids/detours.yaml on the paper's model family: tiny random-init ModernBERT under sdpa (the banded path,
no L x L mask), its prefix-LM and CLM+MLM mixture-by-sequence arms beside the MLM baseline, a few steps each:
the sweep's preflight proves the prefix pattern on the banded path and every arm trains."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ablate.store import rundir
from builders import TOKENIZER, write_yaml

REPO = Path(__file__).resolve().parents[1]
ARMS = ["mlm", "prefix_detour", "mixture_detour"]


def _tiny_detours(tmp_path: Path) -> Path:
    grid = yaml.safe_load((REPO / "grids" / "detours.yaml").read_text())
    grid["base"].update(
        {
            "model": "config:tiny-modernbert",
            "tokenizer": TOKENIZER,
            "attn_implementation": "sdpa",
            "data": {**grid["base"]["data"], "seq_len": 64, "max_documents": 120},  # past the local window (8)
            "batch_size": 4,
            "budget_tokens": 5 * 4 * 64,
            "checkpoint_every": 5,
            "log_every": 1,
            "probe": {"n_texts": 4, "max_length": 32},
        }
    )
    grid["prelude"][0]["steps"] = 2
    for phases in grid["schedules"].values():
        phases[0]["lr"] = {"warmup_steps": 1}
    grid["axes"] = {"schedule": ARMS, "seed": [17]}
    grid.pop("exclude")
    grid["launcher"] = {"executor": "debug"}
    return write_yaml(tmp_path / "detours.yaml", grid, sort_keys=False)


@pytest.mark.slow
def test_the_detours_grid_trains_its_prefix_lm_and_mixture_arms_on_tiny_modernbert_under_sdpa(tmp_path, data_root):
    grid, results = _tiny_detours(tmp_path), tmp_path / "results"
    done = subprocess.run(
        [sys.executable, "-m", "ablate.cli", "sweep", str(grid), "--results", str(results), "--poll", "0.1"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    runs = {
        rundir.read_json(p)["labels"]["axes"]["schedule"]: p.parent
        for p in (results / "detours" / "runs").glob("*/spec.json")
    }
    assert sorted(runs) == sorted(ARMS)
    for arm, phase in (("prefix_detour", "prefix_lm"), ("mixture_detour", "clm_mlm")):
        run = runs[arm]
        assert rundir.read_status(run)["state"] == "done", rundir.read_status(run)
        spec = rundir.read_json(run / "spec.json")
        assert spec["model"] == "config:tiny-modernbert" and spec["attn_implementation"] == "sdpa"
        curves = rundir.read_json(run / "records" / "curves.json")
        losses = [loss for name, loss in zip(curves["phase"], curves["loss"]) if name == phase]
        assert len(losses) == 4 and all(loss == loss and loss > 0 for loss in losses), curves
        # the run's own preflight, before its first step: the prefix pattern on the banded path
        assert (
            "prefix preflight: modernbert under sdpa: causal, the prefix bidirectional"
            in (run / "log.txt").read_text()
        )
    mixture = rundir.read_json(runs["mixture_detour"] / "records" / "curves.json")
    assert {"loss/clm", "loss/mlm"} <= set(mixture)  # both members trained
