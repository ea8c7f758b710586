"""Layer transplants on the real tiny decay sweep (conftest.decay_sweep): hybrids built from finished runs,
checked tensor by tensor against their sources, fine-tuned and put in the tables; bad input exits 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from ablate.config.errors import SpecError


def cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ablate.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=900, env=dict(os.environ))


def _weights(sweep: Path, run_id: str) -> dict[str, torch.Tensor]:
    return load_file(sweep / "runs" / run_id / "model" / "model.safetensors")


def _transplant(decay_sweep, tmp_path, layers: str, *extra: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    results, sweep = decay_sweep
    done = cli(["transplant", "decay", "--results", str(results), "--from", "clm_d40", "--into", "mlm_d40",
                "--layers", layers, *extra], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    runs = pd.read_parquet(sweep / "runs.parquet")
    mine = runs[runs["transplant_layers"].notna() & runs["schedule"].str.endswith(f"[{_describe(layers)}]")]
    return runs, mine


def _describe(layers: str) -> str:
    return {"encoder,head": "emb,0-3,head", "low": "emb,0-1"}[layers]


def test_a_transplant_of_everything_equals_its_source_bit_for_bit(decay_sweep, tmp_path):
    _, sweep = decay_sweep
    runs, hybrids = _transplant(decay_sweep, tmp_path, "encoder,head")
    assert len(hybrids) == 2 and set(hybrids["seed"]) == {17, 18}
    for row in hybrids.itertuples(index=False):
        source, hybrid = _weights(sweep, row.derived_from), _weights(sweep, row.run_id)
        assert runs.set_index("run_id").loc[row.derived_from, "schedule"] == "clm_d40"
        assert runs.set_index("run_id").loc[row.derived_into, "schedule"] == "mlm_d40"
        assert source.keys() == hybrid.keys()
        assert all(torch.equal(source[k], hybrid[k]) and source[k].dtype == hybrid[k].dtype for k in source)


def test_a_low_layer_transplant_takes_embeddings_and_low_blocks_from_the_source(decay_sweep, tmp_path):
    _, sweep = decay_sweep
    runs, hybrids = _transplant(decay_sweep, tmp_path, "low", "--task", "ncbi_disease")
    assert len(hybrids) == 2 and (hybrids["schedule"] == "mlm_d40_clm_d40[emb,0-1]").all()
    for row in hybrids.itertuples(index=False):
        a, b, h = _weights(sweep, row.derived_from), _weights(sweep, row.derived_into), _weights(sweep, row.run_id)
        low = [k for k in h if k.startswith(("bert.embeddings.", "bert.encoder.layer.0.", "bert.encoder.layer.1."))]
        rest = [k for k in h if k not in low]
        assert low and any(k.startswith("bert.encoder.layer.3.") for k in rest) and any("cls." in k for k in rest)
        assert all(torch.equal(h[k], a[k]) for k in low) and all(torch.equal(h[k], b[k]) for k in rest)
        assert not all(torch.equal(a[k], b[k]) for k in low)   # the arms differ, so the test can fail
    scores = pd.read_parquet(sweep / "scores.parquet")
    f1 = scores[scores["run_id"].isin(hybrids["run_id"]) & (scores["metric"] == "entity_f1")]
    assert set(f1["run_id"]) == set(hybrids["run_id"]) and f1["value"].between(0, 1).all()


@pytest.mark.parametrize("args, message", [
    (["--from", "clm_d40", "--into", "mlm_d40", "--layers", "0-4"], "past the model's depth"),
    (["--from", "clm_d40", "--into", "mlm_d40", "--layers", "bottom"], "not a layer split"),
    (["--from", "clm_d99", "--into", "mlm_d40", "--layers", "low"], "no finished run of this arm"),
])
def test_bad_transplants_exit_2(decay_sweep, tmp_path, args, message):
    results, sweep = decay_sweep
    before = sorted(p.name for p in (sweep / "runs").iterdir())
    done = cli(["transplant", "decay", "--results", str(results), *args], tmp_path)
    assert done.returncode == 2 and message in done.stderr
    assert sorted(p.name for p in (sweep / "runs").iterdir()) == before


def test_transplant_between_different_architectures_is_refused():
    from ablate.evaluate.transplant import hybrid_state
    from ablate.models.sources import load_masked_lm

    with pytest.raises(SpecError, match="different architectures or depths"):
        hybrid_state(load_masked_lm("config:tiny-modernbert"), load_masked_lm("config:tiny-bert"), ("low",))
