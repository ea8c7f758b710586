"""Divergence across arms on a real tiny sweep (the CPU twin of grids/decay.yaml, conftest.decay_sweep): the
pairs table against direct CKA on the saved phase-end representations, both figures' data, the decay grid's
dry run, and pairs that cannot be formed."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ablate.analysis.pairs import TWIN, pair_rows, run_info
from ablate.analysis.probe import linear_cka, load_representations
from ablate.config.spec import RunSpec
from ablate.store.rundir import read_json
from in_process import ablate

REPO = Path(__file__).resolve().parents[1]


def cli(args: list[str], cwd: Path):
    """`ablate ARGS` run in this process (tests/in_process.py): the process boundary is not what these test."""
    return ablate(args, cwd)


def _runs(sweep: Path) -> pd.DataFrame:
    runs = pd.read_parquet(sweep / "runs.parquet")
    return runs[~runs["run_id"].str.startswith("tx-")]


def _reps(sweep: Path, run_id: str, phase: str) -> np.ndarray:
    reps, _ = load_representations(sweep / "runs" / run_id / "records" / "reps" / f"{phase}.npz")
    return reps


def _id(runs: pd.DataFrame, schedule: str, seed: int) -> str:
    return runs.loc[(runs["schedule"] == schedule) & (runs["seed"] == seed), "run_id"].item()


@pytest.mark.slow
def test_pairs_join_twins_and_seeds_of_the_same_decay_share_only(decay_sweep):
    _, sweep = decay_sweep
    runs, pairs = _runs(sweep), pd.read_parquet(sweep / "pairs.parquet")
    found = set(pairs[["run_a", "run_b", "relation"]].itertuples(index=False, name=None))
    want = {
        (_id(runs, f"clm_{s}", seed), _id(runs, f"mlm_{s}", seed), "twin")
        for s in ("d10", "d40")
        for seed in (17, 18)
    }
    want |= {(_id(runs, f"mlm_{s}", 17), _id(runs, f"mlm_{s}", 18), "seed-noise") for s in ("d10", "d40")}
    assert found == want
    # every pair at both phase ends (CLM phase "main" against the MLM phase "main", then the decays), every layer
    cka = pairs[pairs["measure"] == "cka"]
    assert set(cka[["position", "phase", "layer"]].drop_duplicates().itertuples(index=False, name=None)) == {
        (p, ph, layer) for p, ph in ((1, "main"), (2, "mlm_decay")) for layer in range(-1, 4)
    }
    assert set(pairs.groupby("relation")["measure"].unique().map(tuple)) == {
        ("cka", "divergence_model", "cka_ratio"),
        ("cka", "divergence_model"),
    }
    # the decay's tokens at each phase end: 0 at the main phase's end, the decay's length (1 or 4 steps of 128)
    ends = pairs[pairs["measure"] == "divergence_model"].groupby(["run_a", "position"])["decay_tokens"].first()
    assert ends[(_id(runs, "clm_d40", 17), 1)] == 0 and ends[(_id(runs, "clm_d40", 17), 2)] == 4 * 128


@pytest.mark.slow
def test_persistence_figure_draws_the_whole_model_divergence_over_the_decay_lengths(decay_sweep, tmp_path):
    data = _figure(decay_sweep, tmp_path, "persistence")
    clm = data[data["kind"] == "CLM vs MLM twin"]
    assert list(clm["decay_tokens"]) == [0, 128, 512] and set(clm.loc[clm["decay_tokens"] > 0, "n"]) == {2}


def test_the_twin_trains_each_main_phase_once_the_shorter_decay_branching_from_the_longer(decay_sweep):
    _, sweep = decay_sweep
    runs = _runs(sweep)
    for objective in ("mlm", "clm"):
        for seed in (17, 18):
            child, parent = _id(runs, f"{objective}_d10", seed), _id(runs, f"{objective}_d40", seed)
            assert read_json(sweep / "runs" / child / "branch.json") == {"parent": parent, "step": 10}
            assert read_json(sweep / "runs" / child / "branched.json")["from"] == "parent"
            # every child of that step started: the parent's branch-point checkpoint is gone
            assert not list((sweep / "runs" / parent / "checkpoints" / "branch").glob("step-*"))
            curves = read_json(sweep / "runs" / child / "records" / "curves.json")
            assert curves["step"] == list(range(1, 12))  # the whole curve, the parent's prefix included


def test_twin_cka_and_ratio_equal_direct_computations_on_the_saved_representations(decay_sweep):
    _, sweep = decay_sweep
    runs, pairs = (
        _runs(sweep),
        pd.read_parquet(sweep / "pairs.parquet").set_index(["run_a", "run_b", "position", "layer", "measure"])[
            "value"
        ],
    )
    clm, mlm, other = _id(runs, "clm_d40", 18), _id(runs, "mlm_d40", 18), _id(runs, "mlm_d40", 17)
    for pos, (phase_a, phase_b) in enumerate([("main", "main"), ("mlm_decay", "mlm_decay")], start=1):
        a, b, c = _reps(sweep, clm, phase_a), _reps(sweep, mlm, phase_b), _reps(sweep, other, phase_b)
        assert a.shape == (5, 8, b.shape[2]) and a.dtype == np.float32  # emb + 4 blocks, 8 probe texts
        for layer in range(-1, 4):
            twin = linear_cka(a[layer + 1], b[layer + 1])
            noise = 1.0 - linear_cka(c[layer + 1], b[layer + 1])
            assert pairs[(clm, mlm, pos, layer, "cka")] == twin
            assert pairs[(other, mlm, pos, layer, "cka")] == 1.0 - noise
            assert pairs[(clm, mlm, pos, layer, "cka_ratio")] == pytest.approx((1.0 - twin) / noise, rel=1e-12)
            assert twin < 1.0 and noise > 0.0


def test_a_run_compared_with_itself_has_cka_one(decay_sweep):
    _, sweep = decay_sweep
    run_id = _id(_runs(sweep), "clm_d10", 17)
    info = run_info(run_id, RunSpec.model_validate(read_json(sweep / "runs" / run_id / "spec.json")))
    rows = pair_rows([(info, info, TWIN)], lambda rid, pos: list(_reps(sweep, rid, info.phases[pos - 1])))
    cka = rows[rows["measure"] == "cka"]
    assert len(cka) == 2 * 5 and np.allclose(cka["value"], 1.0, rtol=0, atol=1e-12)


def _figure(decay_sweep, tmp_path, name: str) -> pd.DataFrame:
    results, sweep = decay_sweep
    done = cli(["report", "decay", "--results", str(results), "--figure", name, "--out", str(tmp_path)], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / f"{name}.png").stat().st_size > 0 and (tmp_path / f"{name}.svg").stat().st_size > 0
    return pd.read_csv(tmp_path / f"{name}.csv")


@pytest.mark.slow
def test_divergence_figure_data_is_the_mean_over_seeds_of_one_minus_cka(decay_sweep, tmp_path):
    _, sweep = decay_sweep
    data, runs = _figure(decay_sweep, tmp_path, "divergence"), _runs(sweep)
    row = data[(data["arm"] == "clm_d10") & (data["position"] == 2) & (data["layer"] == 1)].iloc[0]
    direct = [
        1
        - linear_cka(
            _reps(sweep, _id(runs, "clm_d10", s), "mlm_decay")[2],
            _reps(sweep, _id(runs, "mlm_d10", s), "mlm_decay")[2],
        )
        for s in (17, 18)
    ]
    assert row["mean"] == pytest.approx(np.mean(direct), rel=1e-9) and row["n"] == 2
    assert row["ci_low"] < row["mean"] < row["ci_high"]
    noise = data[(data["relation"] == "seed-noise") & (data["position"] == 1) & (data["layer"] == 3)]
    for share in ("d10", "d40"):  # one seed-noise band per MLM schedule (decay share)
        direct = 1 - linear_cka(
            _reps(sweep, _id(runs, f"mlm_{share}", 17), "main")[4],
            _reps(sweep, _id(runs, f"mlm_{share}", 18), "main")[4],
        )
        assert noise.loc[noise["arm"] == f"MLM seed noise (mlm_{share})", "mean"].item() == pytest.approx(direct)
    assert set(data["position"]) == {1, 2}


@pytest.mark.slow
def test_regions_figure_data_is_the_region_mean_per_phase_end(decay_sweep, tmp_path):
    _, sweep = decay_sweep
    data, runs = _figure(decay_sweep, tmp_path, "regions"), _runs(sweep)
    got = data.set_index(["arm", "position", "region"])["mean"]
    for pos, phase in ((1, "main"), (2, "mlm_decay")):
        per_seed = []
        for s in (17, 18):
            a, b = _reps(sweep, _id(runs, "clm_d40", s), phase), _reps(sweep, _id(runs, "mlm_d40", s), phase)
            per_seed.append([1 - linear_cka(a[i + 1], b[i + 1]) for i in range(4)])
        per_seed = np.asarray(per_seed)  # tiny BERT: low = blocks 0-1, mid = 2, high = 3
        for region, blocks in (("low", [0, 1]), ("mid", [2]), ("high", [3]), ("all", [0, 1, 2, 3])):
            assert got[("clm_d40", pos, region)] == pytest.approx(
                per_seed[:, blocks].mean(axis=1).mean(), rel=1e-9
            )


@pytest.mark.slow
def test_the_divergence_table_has_region_summaries_with_intervals(decay_sweep, tmp_path):
    results, _ = decay_sweep
    done = cli(
        ["report", "decay", "--results", str(results), "--table", "divergence", "--out", str(tmp_path)], tmp_path
    )
    assert done.returncode == 0, done.stderr
    table = pd.read_csv(tmp_path / "divergence.csv")
    twins = table[table["relation"] == "twin"]
    assert set(twins["arm"]) == {"clm_d10", "clm_d40"} and set(twins["region"]) == {
        "low",
        "mid",
        "high",
        "all",
        "model",
    }
    model = twins[twins["region"] == "model"]
    assert (model["measure"] == "divergence_model").all() and model["std"].notna().all()
    assert (twins["n"] == 2).all() and twins["ci_low"].notna().all()


@pytest.mark.slow
def test_decay_grid_dry_run_states_the_pairing_rule(tmp_path):
    done = cli(["sweep", str(REPO / "grids" / "decay.yaml"), "--dry-run"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "10 runs, 2 transplants;" in done.stdout  # one pretraining seed, as the paper
    assert "the seed-noise pairs (and the ratio) need two MLM seeds" in done.stdout
    # the transplants' listing (the cost table has a row per transplant too): ModernBERT: low = blocks 0-7 alone
    hybrids = [
        line.split() for line in done.stdout.splitlines() if line.startswith("tx-") and " transplants[" in line
    ]
    assert sorted((h[2], h[3]) for h in hybrids) == sorted(
        (arm, "17") for arm in ("mlm_d10_clm_d10[0-7]", "clm_d10_mlm_d10[0-7]")
    )
    assert "same model, data, data seed, seed, training settings and phase ends" in done.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    "drop, message",
    [
        (["mlm_d10:18"], "has no finished MLM twin"),
        (["mlm_d10:18", "clm_d10:18"], "has no finished run of another seed"),
    ],
)
def test_pairs_that_cannot_be_formed_name_the_missing_run_and_exit_2(decay_sweep, tmp_path, drop, message):
    results, sweep = decay_sweep
    runs = _runs(sweep)
    gone = {_id(runs, *(lambda s, seed: (s, int(seed)))(*d.split(":"))) for d in drop}
    copy = tmp_path / "r" / "decay"
    shutil.copytree(sweep, copy, ignore=lambda folder, names: [n for n in names if n in gone or n == "model"])
    done = cli(["collect", "decay", "--results", str(tmp_path / "r"), "--pairs"], tmp_path)
    assert done.returncode == 2 and message in done.stderr
    assert any(rid in done.stderr for rid in set(runs["run_id"]) - gone)
