"""The whole model's divergence (the paper's Table "asymmetry": 1 - the mean over the blocks of their linear
CKA) in the pairs table, the divergence table and the persistence figure, and probe texts read from a task's
held-out documents (probe.texts: task:NAME). Small random representations and a real shipped task (HoC)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from ablate.analysis.pairs import MODEL_LAYER, MODEL_MEASURE, NOISE, TWIN, model_divergence, pair_rows
from ablate.analysis.probe import held_out_texts, probe_texts
from ablate.config.base import validate
from ablate.config.errors import SpecError
from ablate.config.spec import RunSpec
from ablate.evaluate.tasks import task_texts
from ablate.launch.data_needs import missing_probe_data, require_probe_data
from ablate.report.divergence import divergence_table
from ablate.report.persistence import persistence_figure
from ablate.report.registry import FIGURES
from ablate.report.sweep import Sweep
from ablate.store.rundir import RunInfo
from builders import run_spec


def _hand_cka(x: np.ndarray, y: np.ndarray) -> float:
    """Linear CKA as the paper writes it: centred Gram matrices K, L; tr(KL) / sqrt(tr(K^2) tr(L^2))."""
    h = np.eye(len(x)) - 1.0 / len(x)
    k, l_ = h @ x @ x.T @ h, h @ y @ y.T @ h
    return float(np.trace(k @ l_) / np.sqrt(np.trace(k @ k) * np.trace(l_ @ l_)))


def _reps(seed: int, layers: int = 4, n: int = 12, d: int = 6) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((n, d)) for _ in range(layers + 1)]  # embeddings output + blocks


def test_whole_model_divergence_is_one_minus_the_mean_block_cka_computed_by_hand():
    a, b = _reps(0), _reps(1)
    from ablate.analysis.probe import cka_vs_reference

    per_layer = cka_vs_reference(a, b)
    by_hand = 1.0 - np.mean([_hand_cka(x, y) for x, y in zip(a[1:], b[1:])])  # embeddings output left out
    assert model_divergence(per_layer) == pytest.approx(by_hand, rel=1e-12)
    assert model_divergence(cka_vs_reference(a, a)) == pytest.approx(0.0, abs=1e-12)


def _info(run_id: str, seed: int, baseline: bool) -> RunInfo:
    return RunInfo(run_id, "same", seed, ("main", "decay"), (10, 14), "mlm" if baseline else "clm", baseline)


def _pairs_of(twins: dict[int, float]):
    """Pairs of a CLM arm and its MLM twin at seeds 1..3 and the MLM seed noise, on random representations,
    with the columns pairs_table adds (decay_tokens, step, objective)."""
    infos = {f"{k}{s}": _info(f"{k}{s}", s, k == "mlm") for k in ("clm", "mlm") for s in twins}
    pairs = [(infos[f"clm{s}"], infos[f"mlm{s}"], TWIN) for s in twins]
    pairs += [
        (infos["mlm1"], infos["mlm2"], NOISE),
        (infos["mlm1"], infos["mlm3"], NOISE),
        (infos["mlm2"], infos["mlm3"], NOISE),
    ]
    reps = {(rid, pos): _reps(hash((rid, pos)) % 1000) for rid in infos for pos in (1, 2)}
    rows = pair_rows(pairs, lambda rid, pos: reps[(rid, pos)])
    rows["step"] = rows["position"].map({1: 10, 2: 14})
    rows["decay_tokens"] = rows["position"].map({1: 0, 2: 512})
    rows["objective"] = rows["run_a"].str[:3].str.upper()
    runs = pd.DataFrame(
        {
            "run_id": list(infos),
            "schedule": [r[:3] for r in infos],
            "freeze": "none",
            "seed": [int(r[3:]) for r in infos],
            "status": "done",
        }
    )
    return rows, runs, reps


def test_pairs_table_has_a_whole_model_row_per_pair_and_phase_end(tmp_path):
    rows, _, reps = _pairs_of({1: 0, 2: 0, 3: 0})
    model = rows[rows["measure"] == MODEL_MEASURE]
    assert (model["layer"] == MODEL_LAYER).all() and len(model) == (3 + 3) * 2
    one = model[(model["run_a"] == "clm2") & (model["position"] == 2)]["value"].item()
    by_hand = 1.0 - np.mean([_hand_cka(x, y) for x, y in zip(reps[("clm2", 2)][1:], reps[("mlm2", 2)][1:])])
    assert one == pytest.approx(by_hand, rel=1e-12)


def test_divergence_table_has_the_whole_model_rows_with_std_and_interval_over_seeds(tmp_path):
    rows, runs, _ = _pairs_of({1: 0, 2: 0, 3: 0})
    table = divergence_table(Sweep(path=tmp_path, runs=runs, pairs=rows))
    model = table[table["region"] == "model"]
    twin = model[(model["relation"] == TWIN) & (model["position"] == 2)].iloc[0]
    values = rows[(rows["measure"] == MODEL_MEASURE) & (rows["relation"] == TWIN) & (rows["position"] == 2)][
        "value"
    ]
    assert twin["measure"] == MODEL_MEASURE and twin["n"] == 3
    assert twin["mean"] == pytest.approx(values.mean()) and twin["std"] == pytest.approx(values.std(ddof=0))
    assert twin["ci_low"] < twin["mean"] < twin["ci_high"] and twin["decay_tokens"] == 512
    assert set(model["relation"]) == {TWIN, NOISE}
    # the whole model's divergence equals the "all blocks" region's mean of 1 - CKA
    regions = table[(table["region"] == "all") & (table["relation"] == TWIN) & (table["position"] == 2)]
    assert regions["mean"].item() == pytest.approx(twin["mean"], rel=1e-12)


def test_persistence_figure_draws_the_whole_model_divergence_over_decay_tokens(tmp_path):
    rows, runs, _ = _pairs_of({1: 0, 2: 0, 3: 0})
    assert FIGURES["persistence"].draw is persistence_figure
    fig, data = persistence_figure(Sweep(path=tmp_path, runs=runs, pairs=rows))
    assert set(data["kind"]) == {"CLM vs MLM twin", "MLM seed noise"}
    clm = data[data["kind"] == "CLM vs MLM twin"].set_index("decay_tokens")
    want = rows[(rows["measure"] == MODEL_MEASURE) & (rows["relation"] == TWIN) & (rows["position"] == 2)]
    assert list(clm.index) == [0, 512] and clm.loc[512, "mean"] == pytest.approx(want["value"].mean())
    assert len(fig.axes[0].lines) == 2
    with pytest.raises(SpecError, match="unknown x axis"):
        persistence_figure(Sweep(path=tmp_path, runs=runs, pairs=rows), x="tokens")


def _spec(tmp_path, **probe) -> RunSpec:
    return validate(RunSpec, run_spec(probe={"n_texts": 8, **probe}), str(tmp_path / "spec.yaml"))


def test_probe_texts_from_a_task_read_its_test_split_and_pool_several_sources(tmp_path, data_root):
    spec = _spec(tmp_path, texts="task:hoc")
    assert spec.probe.texts == ("task:hoc",)
    pool = held_out_texts(spec, read_task=task_texts)
    assert pool == task_texts("hoc", "test", None) and len(pool) > 8
    chosen = probe_texts(pool, 8, spec.probe.seed)
    assert len(chosen) == 8 and set(chosen) <= set(pool)
    both = held_out_texts(_spec(tmp_path, texts=["task:hoc:dev", "corpus_en_e3c/valid.txt"]), read_task=task_texts)
    dev = task_texts("hoc", "dev", None)
    assert both[: len(dev)] == dev and len(both) > len(dev)


def test_probe_texts_default_to_the_valid_corpus_and_leave_the_run_id_unchanged(tmp_path, data_root):
    plain = _spec(tmp_path)
    assert plain.probe.texts is None
    assert _spec(tmp_path, texts="task:hoc").run_id == plain.run_id  # a measurement setting, not training


@pytest.mark.parametrize(
    "texts, message",
    [
        ("task:hoc:validation", "SPLIT one of"),
        ([], "no source; allowed: at least one source"),
        (["task:hoc", "task:hoc"], "listed twice"),
    ],
)
def test_a_malformed_probe_source_is_a_spec_error(tmp_path, texts, message):
    with pytest.raises(SpecError, match=message):
        _spec(tmp_path, texts=texts)


def test_a_probe_task_whose_data_is_missing_is_refused_naming_the_fetch_command(tmp_path, data_root):
    spec = _spec(tmp_path, texts=["task:hoc", "task:diamed:train"])
    if not missing_probe_data([spec]):
        pytest.skip("this data root holds DiaMED")
    with pytest.raises(SpecError, match="ablate data fetch diamed") as caught:
        require_probe_data([spec], file="grid.yaml")
    assert caught.value.key == "probe.texts" and caught.value.file == "grid.yaml"
    with pytest.raises(SpecError, match="unknown task"):
        missing_probe_data([_spec(tmp_path, texts="task:no_such_task")])
