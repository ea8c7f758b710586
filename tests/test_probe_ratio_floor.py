"""The CKA ratio is undefined (NaN) where its seed noise is float rounding, a number equal to the direct
computation where the noise is real; the layer probe refuses to measure on fewer held-out texts than it asks
for, before anything runs (check_probe_texts) and in `collect --cka-ratio`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ablate.analysis.pairs import NOISE, TWIN, pair_rows
from ablate.analysis.probe import check_probe_texts, linear_cka, probe_texts
from ablate.analysis.ratio import NOISE_FLOOR, add_cka_ratio, cka_ratio, noise_ratio
from ablate.config.errors import SpecError
from ablate.config.grid import load_grid
from ablate.config.spec import dump_run_spec
from ablate.plan.grid import expand
from ablate.store import atomic
from ablate.store.rundir import RunInfo

SMOKE = str(Path(__file__).resolve().parents[1] / "grids" / "smoke.yaml")

# --- the ratio ------------------------------------------------------------------------------------------------


def _runs(*rows):
    return pd.DataFrame(rows, columns=["run_id", "model", "schedule", "freeze", "seed", "status", "model_dir"])


RUNS = _runs(
    ("mlm0", "m", "mlm", "none", 0, "done", ""),
    ("mlm1", "m", "mlm", "none", 1, "done", ""),
    ("clm0", "m", "clm", "none", 0, "done", ""),
)


def _layers(seed: int, n_layers: int = 3) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(64, 16)) + 3.0).astype(np.float32) for _ in range(n_layers)]


def _one_ulp(x: np.ndarray) -> np.ndarray:
    """x moved by one float32 ulp at every entry: a float32 recomputation of the same representations."""
    return np.nextafter(x, np.float32(np.inf)).astype(np.float32)


def test_a_ratio_from_identical_representations_is_nan():
    x = _layers(0)
    got = cka_ratio(RUNS, texts=[], reps={"mlm0": x, "mlm1": [a.copy() for a in x], "clm0": [a.copy() for a in x]})
    assert len(got) == 3 and got["value"].isna().all()


def test_a_ratio_over_float32_rounding_noise_is_nan_although_the_arrays_differ():
    x, moved = _layers(0), _layers(1)
    rounded = [_one_ulp(a) for a in x]
    noise = [1.0 - linear_cka(a, b) for a, b in zip(x, rounded)]
    assert all(0.0 <= n < NOISE_FLOOR for n in noise)  # rounding, far below the floor
    assert not any(np.array_equal(a, b) for a, b in zip(x, rounded))
    got = cka_ratio(RUNS, texts=[], reps={"mlm0": x, "mlm1": rounded, "clm0": moved})
    assert got["value"].isna().all()


def test_a_frozen_warmup_gives_nan_where_frozen_and_the_direct_ratio_where_the_noise_is_real():
    """As behind an encoder frozen in the shared warm-up: the embeddings output (layer -1) is bitwise the same
    in every run; the blocks carry real seed noise and a real move."""
    mlm0, mlm1, clm0 = _layers(0), _layers(2), _layers(3)
    mlm1[0], clm0[0] = mlm0[0].copy(), mlm0[0].copy()
    got = cka_ratio(RUNS, texts=[], reps={"mlm0": mlm0, "mlm1": mlm1, "clm0": clm0}).set_index("layer")["value"]
    assert np.isnan(got[-1])
    for layer in (0, 1):
        direct = (1.0 - linear_cka(clm0[layer + 1], mlm0[layer + 1])) / (
            1.0 - linear_cka(mlm1[layer + 1], mlm0[layer + 1])
        )
        assert np.isfinite(got[layer]) and got[layer] == pytest.approx(direct, rel=1e-12)


def _info(run_id: str, seed: int, baseline: bool) -> RunInfo:
    return RunInfo(run_id, "id", seed, ("warmup", "main"), (2, 5), "mlm" if baseline else "clm", baseline)


def test_the_pairs_table_ratio_follows_the_same_rule():
    arm, twin, partner = _info("clm0", 0, False), _info("mlm0", 0, True), _info("mlm1", 1, True)
    frozen = _layers(0)  # phase 1: the same for all three runs
    reps = {
        ("clm0", 1): frozen,
        ("mlm0", 1): [a.copy() for a in frozen],
        ("mlm1", 1): [_one_ulp(a) for a in frozen],
        ("clm0", 2): _layers(3),
        ("mlm0", 2): _layers(4),
        ("mlm1", 2): _layers(5),
    }
    rows = pair_rows([(arm, twin, TWIN), (twin, partner, NOISE)], lambda run_id, pos: reps[(run_id, pos)])
    ratio = rows[rows["measure"] == "cka_ratio"].set_index(["position", "layer"])["value"]
    assert ratio.loc[1].isna().all()
    for layer in (-1, 0, 1):
        a, b, c = reps[("clm0", 2)][layer + 1], reps[("mlm0", 2)][layer + 1], reps[("mlm1", 2)][layer + 1]
        direct = (1.0 - linear_cka(a, b)) / (1.0 - linear_cka(c, b))
        assert ratio[(2, layer)] == pytest.approx(direct, rel=1e-12)


def test_noise_ratio_is_undefined_below_the_floor_only():
    got = noise_ratio([2e-3, 2e-3, 2e-3, 0.0], [1e-3, NOISE_FLOOR, 0.5 * NOISE_FLOOR, np.nan])
    assert got[0] == pytest.approx(2.0) and got[1] == pytest.approx(2e-3 / NOISE_FLOOR)
    assert np.isnan(got[2]) and np.isnan(got[3])
    assert np.isnan(noise_ratio([2e-3], [1e-3], identical=[True])[0])


# --- the probe's held-out texts ---------------------------------------------------------------------------------


def test_probe_texts_refuses_fewer_texts_than_asked_naming_all_of_it():
    texts = [f"text {i}" for i in range(37)] + ["", "  "]
    with pytest.raises(SpecError) as err:
        probe_texts(texts, 500, seed=0, corpus="corpus_fr_e3c/valid.txt")
    e = err.value
    assert (e.file, e.key, e.value) == ("corpus_fr_e3c/valid.txt", "probe.n_texts", 500)
    assert "37 usable" in e.message and "500 held-out texts" in e.message and "at most 37" in e.allowed
    assert probe_texts(texts, 37, seed=0) == texts[:37]


def _specs(grid: str, **probe) -> list:
    specs = [r.spec for r in expand(load_grid(grid))]
    return [s.model_copy(update={"probe": s.probe.model_copy(update=probe)}) for s in specs] if probe else specs


@pytest.fixture
def no_models(monkeypatch):
    """Any model or tokenizer load fails the test: the check reads corpora only."""
    from ablate.models import loading

    def refuse(*_a, **_k):
        raise AssertionError("check_probe_texts loaded a model")

    monkeypatch.setattr(loading, "load_masked_lm", refuse)
    monkeypatch.setattr(loading, "load_tokenizer", refuse)


def test_check_probe_texts_passes_the_smoke_grid_and_refuses_more_texts_than_the_corpus_has(data_root, no_models):
    check_probe_texts(_specs(SMOKE), SMOKE)  # 64 of 399 English texts
    with pytest.raises(SpecError) as err:
        check_probe_texts(_specs(SMOKE, n_texts=400), SMOKE)
    e = err.value
    assert (e.file, e.key, e.value) == (SMOKE, "probe.n_texts", 400)
    assert "corpus_en_e3c/valid.txt" in e.message and "399 usable" in e.message
    check_probe_texts(_specs(SMOKE, n_texts=0), SMOKE)  # no probe: nothing to check


def test_collect_cka_ratio_refuses_more_texts_than_the_corpus_has(tmp_path, data_root):
    spec = dump_run_spec(_specs(SMOKE)[0])
    spec["data"]["valid_corpus"] = "corpus_fr_e3c/valid.txt"  # 37 texts
    atomic.write_json(tmp_path / "runs" / "r1" / "spec.json", spec)
    tables = {"runs": pd.DataFrame({"run_id": ["r1"], "status": ["done"]}), "layers": pd.DataFrame()}
    with pytest.raises(SpecError) as err:
        add_cka_ratio(tmp_path, tables, 500)
    assert err.value.key == "--cka-ratio" and "37 usable" in err.value.message
