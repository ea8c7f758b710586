"""Figures from a small, schema-true sweep: files written, CSV equal to the plotted data, bad input."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ablate.evaluate.bootstrap import paired_bootstrap
from scipy import stats

from ablate import report
from ablate.config.errors import SpecError

ROOT = Path(__file__).resolve().parents[1]
TABLE_FIGURES = ("layers", "deltas", "curves", "freeze")  # drawn from the tidy tables alone
N_LAYERS = 4
WARMUP = {"head_warmup": [-1, 0, 1, 2, 3]}  # the whole encoder frozen: the head trains alone
ARMS = [  # schedule, freeze, frozen layers per phase (the frozen table's rows), phases
    ("mlm", "none", {}, ["mlm", "mlm_decay"]),
    ("clm", "none", WARMUP, ["head_warmup", "clm", "mlm_decay"]),
    ("clm", "low", {**WARMUP, "clm": [-1, 0, 1]}, ["head_warmup", "clm", "mlm_decay"]),
    ("clm", "decay_low", {**WARMUP, "mlm_decay": [0, 1]}, ["head_warmup", "clm", "mlm_decay"]),
]
TASKS = {"ner_a": ["f1", "precision"], "cls_b": ["accuracy", "macro_f1"], "sts_c": ["pearson"]}


def write_sweep(
    path: Path,
    *,
    rng_seed: int = 0,
    clm_gain: float = 0.02,
    models=("tiny-bert",),
    seed_independent: bool = True,
    languages: dict | None = None,
    n_examples: dict | None = None,
) -> Path:
    """A finished sweep as `ablate collect` leaves it: runs, scores, layers, curves, frozen as parquet + csv.

    Three seeds per arm; clm/low seed 2 failed (its rows carry absurd values, so using them shows).
    `languages` (task -> language; default all "en") and `n_examples` (task -> examples per split, the
    column score files record; default none) shape the scores table.
    """
    rng = np.random.default_rng(rng_seed)
    runs, scores, layers, curves, frozen_rows = [], [], [], [], []
    for model in models:
        for schedule, freeze, frozen, phases in ARMS:
            for seed in (0, 1, 2):
                failed = (schedule, freeze, seed) == ("clm", "low", 2)
                bad = 1000.0 if failed else 0.0
                run_id = f"{model}-{schedule}-{freeze}-s{seed}"
                runs.append(
                    dict(
                        run_id=run_id,
                        sweep=path.name,
                        model=model,
                        schedule=schedule,
                        freeze=freeze,
                        seed=seed,
                        lr=2e-4,
                        status="failed" if failed else "done",
                        token_hash="abc123",
                        tokens_seen=3000,
                        wall_time_s=12.5,
                        model_dir="",
                        n_layers=N_LAYERS,
                        seed_independent=seed_independent,
                    )
                )
                frozen_rows += [
                    dict(run_id=run_id, phase=phase, layer=layer) for phase, idx in frozen.items() for layer in idx
                ]
                tokens = 0
                for p, phase in enumerate(phases):
                    for k in range(10):
                        tokens += 100
                        step = p * 10 + k
                        lr = 2e-4 * (1 - k / 10) if phase == "mlm_decay" else 2e-4 * min(1.0, (k + 1) / 3)
                        curves.append(
                            dict(
                                run_id=run_id,
                                phase=phase,
                                step=step,
                                tokens=tokens,
                                lr=lr,
                                loss=5.0 - 0.1 * step + 0.05 * rng.normal() + 0.3 * (schedule == "clm") + bad,
                            )
                        )
                    for layer in range(-1, N_LAYERS):
                        moved = (
                            (0.05 + 0.1 * (schedule == "clm") * (N_LAYERS - layer) / N_LAYERS)
                            * (p + 1)
                            / len(phases)
                        )
                        for measure, value in (
                            ("cka_vs_base", 1 - moved - 0.01 * rng.random() - bad),
                            ("weight_rel_change", moved / 3 + 0.001 * rng.random() + bad),
                            ("grad_norm", 1.0 + rng.random() + bad),
                        ):
                            layers.append(
                                dict(run_id=run_id, phase=phase, layer=layer, measure=measure, value=value)
                            )
                if schedule != "mlm":
                    for layer in range(-1, N_LAYERS):
                        layers.append(
                            dict(
                                run_id=run_id,
                                phase="final",
                                layer=layer,
                                measure="cka_ratio_vs_mlm",
                                value=1.0 + 3 * rng.random() + bad,
                            )
                        )
                for t, (task, metrics) in enumerate(TASKS.items()):
                    for ft_seed in range(3):
                        for split in ("dev", "test"):
                            base = (
                                0.6
                                + 0.05 * t
                                + clm_gain * (schedule == "clm")
                                - 0.01 * (freeze == "low")
                                + 0.01 * rng.normal()
                                + bad
                            )
                            for m, metric in enumerate(metrics):
                                scores.append(
                                    dict(
                                        run_id=run_id,
                                        task=task,
                                        language=(languages or {}).get(task, "en"),
                                        finetune_seed=ft_seed,
                                        split=split,
                                        metric=metric,
                                        value=base - 0.02 * m,
                                        epoch=3,
                                        wall_time_s=1.0,
                                        **({"n_examples": n_examples[task]} if n_examples else {}),
                                    )
                                )
    path.mkdir(parents=True, exist_ok=True)
    for name, rows in (
        ("runs", runs),
        ("scores", scores),
        ("layers", layers),
        ("curves", curves),
        ("frozen", frozen_rows),
    ):
        df = pd.DataFrame(rows)
        df.to_parquet(path / f"{name}.parquet", index=False)
        df.to_csv(path / f"{name}.csv", index=False)
    return path


def rewrite(path: Path, name: str, df: pd.DataFrame | None):
    for ext in ("parquet", "csv"):
        (path / f"{name}.{ext}").unlink(missing_ok=True)
    if df is not None:
        df.to_parquet(path / f"{name}.parquet", index=False)
        df.to_csv(path / f"{name}.csv", index=False)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    write_sweep(root / "sweep_a")
    b = write_sweep(root / "sweep_b", rng_seed=1, clm_gain=0.0)
    os.utime(b / "runs.parquet", (2e9, 2e9))  # b is the most recent sweep
    return root


@pytest.fixture(scope="module")
def sweep_dir(results):
    return results / "sweep_a"


@pytest.fixture
def sweep_copy(sweep_dir, tmp_path):
    return Path(shutil.copytree(sweep_dir, tmp_path / "copy"))


def read(path: Path, name: str) -> pd.DataFrame:
    return pd.read_parquet(path / f"{name}.parquet")


def done(path: Path) -> pd.DataFrame:
    runs = read(path, "runs")
    return runs.loc[runs["status"] == "done", ["run_id", "model", "schedule", "freeze", "seed"]]


def t_interval(values):
    v = np.asarray(values, dtype=float)
    lo, hi = stats.t.interval(0.95, len(v) - 1, loc=v.mean(), scale=stats.sem(v))
    return v.mean(), lo, hi


def plotted_lines(ax) -> dict[str, np.ndarray]:
    return {
        l.get_label(): np.asarray(l.get_ydata(), dtype=float)
        for l in ax.get_lines()
        if not l.get_label().startswith("_")
    }


# --- files ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", TABLE_FIGURES)
def test_every_figure_writes_png_svg_csv(sweep_dir, tmp_path, name):
    from PIL import Image

    paths = report.make_figure(name, sweep_dir, out=tmp_path / "figs")
    assert set(paths) == {"png", "svg", "csv"}
    assert paths["png"] == tmp_path / "figs" / f"{name}.png"
    for p in paths.values():
        assert p.is_file() and p.stat().st_size > 0
    with Image.open(paths["png"]) as im:
        assert round(im.info["dpi"][0]) == 300 and im.size[0] > 1000
    assert "<svg" in paths["svg"].read_text()[:500]
    csv = pd.read_csv(paths["csv"], keep_default_na=False, na_values=["nan", "NaN"])
    _, data = report.FIGURES[name](report.load_sweep(sweep_dir))
    pd.testing.assert_frame_equal(csv, data, check_dtype=False, check_exact=False, rtol=1e-12)


def test_default_output_and_pdf(sweep_copy):
    paths = report.make_figure("freeze", sweep_copy)
    assert paths["png"] == sweep_copy / "figures" / "freeze.png" and paths["png"].is_file()
    paths = report.make_figure("freeze", sweep_copy, out=sweep_copy / "paper" / "fig3.pdf")
    assert set(paths) == {"png", "pdf", "csv"} and paths["pdf"].name == "fig3.pdf"
    assert paths["pdf"].read_bytes()[:4] == b"%PDF"


# --- layers ----------------------------------------------------------------------------------------------


def test_layers_default_is_one_minus_cka_at_last_phase(sweep_dir):
    fig, data = report.layers_figure(report.load_sweep(sweep_dir))
    lay = read(sweep_dir, "layers").merge(done(sweep_dir), on="run_id")
    lay = lay[(lay["measure"] == "cka_vs_base") & (lay["phase"] == "mlm_decay")]
    for (s, f, layer), g in lay.groupby(["schedule", "freeze", "layer"]):
        row = data[(data["schedule"] == s) & (data["freeze"] == f) & (data["layer"] == layer)].iloc[0]
        m, lo, hi = t_interval(1 - g["value"])
        assert (row["mean"], row["ci_low"], row["ci_high"]) == pytest.approx((m, lo, hi), rel=1e-10)
        assert row["n"] == (2 if (s, f) == ("clm", "low") else 3)
    assert set(data["phase"]) == {"mlm_decay"} and set(data["measure"]) == {"1 - cka_vs_base"}
    assert data["arm"].drop_duplicates().tolist() == ["mlm", "clm", "clm, freeze low", "clm, freeze decay_low"]
    # the plotted lines are the CSV means, arm by arm
    lines = plotted_lines(fig.axes[0])
    assert set(lines) == set(data["arm"])
    for arm, g in data.groupby("arm"):
        np.testing.assert_allclose(lines[arm], g.sort_values("layer")["mean"])
    # frozen markers from the frozen table: the head warm-up froze every layer, so it is not drawn; low froze
    # emb,0,1 during clm; decay_low froze 0,1 during the decay
    frozen = data.set_index(["freeze", "layer"])["frozen_in"]
    assert [frozen["low", l] for l in range(-1, 4)] == ["clm", "clm", "clm", "", ""]
    assert [frozen["decay_low", l] for l in range(-1, 4)] == ["", "mlm_decay", "mlm_decay", "", ""]
    assert (data.loc[data["freeze"] == "none", "frozen_in"] == "").all()
    strip = fig.axes[1]
    bars = sorted((round(b.get_y() + b.get_height() / 2), b.get_x(), b.get_width()) for b in strip.patches)
    assert bars == [(0, pytest.approx(-1.4), pytest.approx(2.8)), (1, pytest.approx(-0.4), pytest.approx(1.8))]
    assert [t.get_text() for t in strip.get_yticklabels()] == ["low · clm", "decay_low · mlm_decay"]


def test_layers_other_measures_and_phases(sweep_dir):
    sw = report.load_sweep(sweep_dir)
    _, data = report.layers_figure(sw, measure="weight_rel_change", phase="clm")
    assert set(data["schedule"]) == {"clm"}  # the baseline has no clm phase
    lay = read(sweep_dir, "layers").merge(done(sweep_dir), on="run_id")
    want = (
        lay[(lay["measure"] == "weight_rel_change") & (lay["phase"] == "clm")]
        .groupby(["freeze", "layer"])["value"]
        .mean()
    )
    got = data.set_index(["freeze", "layer"])["mean"]
    pd.testing.assert_series_equal(got.sort_index(), want.sort_index(), check_names=False)

    fig, ratio = report.layers_figure(sw, measure="cka_ratio_vs_mlm")
    assert set(ratio["phase"]) == {"final"} and "mlm" not in set(ratio["schedule"])
    assert any(l.get_label() == "_seed noise" and set(l.get_ydata()) == {1.0} for l in fig.axes[0].get_lines())


def test_layers_bad_measure_and_phase(sweep_dir):
    sw = report.load_sweep(sweep_dir)
    with pytest.raises(SpecError, match="cka_vs_base.*weight_rel_change") as e:
        report.layers_figure(sw, measure="nope")
    assert e.value.key == "measure"
    with pytest.raises(SpecError, match="allowed: last, mlm, mlm_decay"):
        report.layers_figure(sw, phase="nope")


def test_layers_panels_by_model(tmp_path):
    path = write_sweep(tmp_path / "two_models", models=("bert-a", "bert-b"))
    fig, data = report.layers_figure(report.load_sweep(path))
    assert data.columns[0] == "model" and data["model"].drop_duplicates().tolist() == ["bert-a", "bert-b"]
    assert sum(1 for ax in fig.axes if plotted_lines(ax)) == 2
    _, single = report.layers_figure(report.load_sweep(path), panel=None)
    assert "model" not in single.columns and single["n"].max() == 6
    with pytest.raises(SpecError, match="panel"):
        report.curves_figure(report.load_sweep(path), panel="lr")  # a runs axis that clashes with curves.lr


# --- downstream --------------------------------------------------------------------------------------------


def _unit_scores(sweep_dir, metric_of=None):
    sc = read(sweep_dir, "scores").merge(done(sweep_dir), on="run_id")
    metric_of = metric_of or {"ner_a": "f1", "cls_b": "accuracy", "sts_c": "pearson"}
    sc = sc[(sc["split"] == "test") & (sc["metric"] == sc["task"].map(metric_of))]
    return sc.assign(score=100 * sc["value"])


def test_deltas_paired_over_seed_units(sweep_dir):
    fig, data = report.deltas_figure(report.load_sweep(sweep_dir))
    sc = _unit_scores(sweep_dir)
    base = sc[sc["schedule"] == "mlm"].set_index(["task", "seed", "finetune_seed"])["score"]
    for (f, task), row in data.set_index(["freeze", "task"]).iterrows():
        arm = sc[(sc["schedule"] == "clm") & (sc["freeze"] == f)].set_index(["task", "seed", "finetune_seed"])[
            "score"
        ]
        if task == "average":
            a, b = arm.groupby(level=[1, 2]).mean(), base.groupby(level=[1, 2]).mean()
        else:
            a, b = arm.loc[task], base.loc[task]
        diff = (a - b.loc[a.index]).to_numpy()
        boot = paired_bootstrap(a.to_numpy(), b.loc[a.index].to_numpy())
        assert row["delta"] == pytest.approx(diff.mean(), rel=1e-10)
        assert (row["ci_low"], row["ci_high"], row["p_value"]) == pytest.approx(
            (boot.ci_low, boot.ci_high, boot.p_value), rel=1e-10
        )
        assert row["ci_low"] <= row["delta"] <= row["ci_high"]
        assert row["n_pairs"] == len(diff) == (6 if f == "low" else 9)
        assert row["ci_method"] == "paired bootstrap"
    assert data["task"].drop_duplicates().tolist() == ["ner_a", "cls_b", "sts_c", "average"]
    assert "mlm" not in set(data["schedule"])
    ax = fig.axes[0]
    for c in ax.containers:
        arm = c.get_label()
        np.testing.assert_allclose(
            np.asarray(c.lines[0].get_ydata(), float), data.loc[data["arm"] == arm, "delta"]
        )
    assert {c.get_label() for c in ax.containers} == set(data["arm"])


def test_deltas_unpaired_falls_back_to_welch(sweep_copy):
    runs = read(sweep_copy, "runs")
    runs.loc[runs["schedule"] == "mlm", "seed"] += 10  # no shared seeds with the arms
    rewrite(sweep_copy, "runs", runs)
    _, data = report.deltas_figure(report.load_sweep(sweep_copy))
    assert set(data["ci_method"]) == {"welch"}
    row = data[(data["arm"] == "clm") & (data["task"] == "ner_a")].iloc[0]
    sc = _unit_scores(sweep_copy)
    a = sc[(sc["schedule"] == "clm") & (sc["freeze"] == "none") & (sc["task"] == "ner_a")]["score"]
    b = sc[(sc["schedule"] == "mlm") & (sc["task"] == "ner_a")]["score"]
    res = stats.ttest_ind(a, b, equal_var=False)
    lo, hi = res.confidence_interval(0.95)
    assert (row["delta"], row["ci_low"], row["ci_high"]) == pytest.approx((a.mean() - b.mean(), lo, hi), rel=1e-9)


def test_primary_metric_column_and_split(sweep_copy):
    scores = read(sweep_copy, "scores")
    scores["primary"] = scores["metric"].isin(["precision", "macro_f1"])  # none flagged for sts_c
    rewrite(sweep_copy, "scores", scores)
    ps = report.primary_scores(report.load_sweep(sweep_copy))
    assert dict(ps.drop_duplicates("task")[["task", "metric"]].to_numpy()) == {
        "ner_a": "precision",
        "cls_b": "macro_f1",
        "sts_c": "pearson",
    }
    (sweep_copy / "scores.parquet").unlink()  # the csv spells the flag "True" / "False"
    assert report.primary_scores(report.load_sweep(sweep_copy))["metric"].drop_duplicates().tolist() == [
        "precision",
        "macro_f1",
        "pearson",
    ]
    assert set(ps["split"]) == {"test"}
    assert report.primary_scores(report.load_sweep(sweep_copy), split="dev")["split"].eq("dev").all()
    with pytest.raises(SpecError, match="allowed: dev, test"):
        report.deltas_figure(report.load_sweep(sweep_copy), split="valid")


def test_freeze_heatmap_means(sweep_dir):
    fig, data = report.freeze_figure(report.load_sweep(sweep_dir))
    sc = _unit_scores(sweep_dir)
    per_run = (
        sc.groupby(["schedule", "freeze", "run_id", "task"])["score"]
        .mean()
        .groupby(["schedule", "freeze", "run_id"])
        .mean()
    )
    want = per_run.groupby(["schedule", "freeze"]).mean()
    got = data.set_index(["schedule", "freeze"])["mean"]
    pd.testing.assert_series_equal(got.sort_index(), want.sort_index(), check_names=False)
    ci = t_interval(per_run.loc[("clm", "none")])
    assert tuple(
        data[data["schedule"].eq("clm") & data["freeze"].eq("none")][["mean", "ci_low", "ci_high"]].iloc[0]
    ) == pytest.approx(ci, rel=1e-10)
    grid = data.pivot(index="freeze", columns="schedule", values="mean").reindex(
        index=["none", "low", "decay_low"], columns=["mlm", "clm"]
    )
    mesh = fig.axes[0].collections[0].get_array()
    np.testing.assert_allclose(np.ma.filled(mesh, np.nan).ravel(), grid.to_numpy().ravel())


# --- curves ------------------------------------------------------------------------------------------------


def test_curves_mean_over_seeds_and_plotted(sweep_dir):
    fig, data = report.curves_figure(report.load_sweep(sweep_dir))
    cur = read(sweep_dir, "curves").merge(done(sweep_dir), on="run_id")
    want = cur.groupby(["schedule", "freeze", "phase", "step"])[["loss", "lr", "tokens"]].mean()
    got = data.set_index(["schedule", "freeze", "phase", "step"])[["loss", "lr", "tokens"]]
    pd.testing.assert_frame_equal(got.sort_index(), want.sort_index(), check_dtype=False)
    assert data["loss"].max() < 100  # the failed run's curve is not in
    ax_loss, ax_lr = fig.axes[1], fig.axes[2]
    loss_lines = [l for l in ax_loss.get_lines() if l.get_label().lstrip("_") in set(data["arm"])]
    for arm, g in data.groupby("arm", sort=False):
        ys = np.concatenate([l.get_ydata() for l in loss_lines if l.get_label().lstrip("_") == arm])
        np.testing.assert_allclose(ys, g["loss"])
        xs = np.concatenate([l.get_xdata() for l in ax_lr.get_lines() if l.get_label().lstrip("_") == arm])
        np.testing.assert_allclose(xs * 1e3, g["tokens"])  # axis in thousands of tokens
    assert ax_lr.get_xlabel() == "tokens seen (thousands)"
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["mlm", "clm"]


def test_curves_smoothing_option(sweep_dir, tmp_path):
    paths = report.make_figure("curves", sweep_dir, out=tmp_path, smooth="3")  # CLI strings are coerced
    data = pd.read_csv(paths["csv"])
    cur = read(sweep_dir, "curves").merge(done(sweep_dir), on="run_id").sort_values(["run_id", "step"])
    cur["loss"] = cur.groupby(["run_id", "phase"])["loss"].transform(lambda s: s.rolling(3, min_periods=1).mean())
    want = cur.groupby(["schedule", "freeze", "phase", "step"])["loss"].mean()
    got = data.set_index(["schedule", "freeze", "phase", "step"])["loss"]
    pd.testing.assert_series_equal(got.sort_index(), want.sort_index(), check_names=False)
    with pytest.raises(SpecError, match="smooth"):
        report.make_figure("curves", sweep_dir, out=tmp_path, smooth=0)
    with pytest.raises(SpecError, match="wrong type"):
        report.make_figure("curves", sweep_dir, out=tmp_path, smooth="three")


# --- bad input ---------------------------------------------------------------------------------------------


def test_unknown_figure_lists_available(sweep_dir):
    with pytest.raises(SpecError, match="allowed: layers, deltas, curves, freeze") as e:
        report.make_figure("heatmap", sweep_dir)
    assert e.value.value == "heatmap"


def test_unknown_option_lists_options(sweep_dir):
    with pytest.raises(SpecError, match="allowed: measure, phase, baseline, panel, logy"):
        report.make_figure("layers", sweep_dir, colour="red")


def test_deltas_without_mlm_baseline(sweep_copy):
    runs = read(sweep_copy, "runs")
    rewrite(sweep_copy, "runs", runs[runs["schedule"] != "mlm"])
    with pytest.raises(SpecError, match="MLM-baseline runs .schedule 'mlm', freeze 'none'"):
        report.make_figure("deltas", sweep_copy)
    report.make_figure("deltas", sweep_copy, baseline="clm")  # another reference works


def test_missing_tables_say_what_is_missing(sweep_copy):
    rewrite(sweep_copy, "scores", None)
    rewrite(sweep_copy, "curves", None)
    for name, table in (("deltas", "scores"), ("freeze", "scores"), ("curves", "curves")):
        with pytest.raises(SpecError, match=f"needs the {table} table"):
            report.make_figure(name, sweep_copy)
    report.make_figure("layers", sweep_copy)  # phase order falls back to the layers table


def test_csv_only_sweep_gives_same_data(sweep_dir, sweep_copy):
    for p in sweep_copy.glob("*.parquet"):
        p.unlink()
    for name in TABLE_FIGURES:
        fn = report.FIGURES[name]
        _, from_csv = fn(report.load_sweep(sweep_copy))
        _, from_parquet = fn(report.load_sweep(sweep_dir))
        pd.testing.assert_frame_equal(from_csv, from_parquet, check_dtype=False)


def test_resolve_sweep(results, tmp_path, monkeypatch):
    monkeypatch.setenv("ABLATE_RESULTS", str(results))
    assert report.resolve_sweep() == results / "sweep_b"
    assert report.resolve_sweep("sweep_a") == results / "sweep_a"
    assert report.resolve_sweep(results / "sweep_a") == results / "sweep_a"
    with pytest.raises(SpecError, match="allowed: sweep_a, sweep_b"):
        report.resolve_sweep("sweep_c")
    monkeypatch.setenv("ABLATE_RESULTS", str(tmp_path))
    with pytest.raises(SpecError, match="ablate collect"):
        report.make_figure("layers")


def test_a_phase_that_froze_every_layer_is_not_drawn():
    layers = pd.DataFrame({"run_id": ["a"] * 5 + ["b"] * 5, "layer": [-1, 0, 1, 2, 3] * 2})
    frozen = pd.DataFrame(
        {
            "run_id": ["a"] * 8 + ["b"] * 4,
            "phase": ["warm"] * 5 + ["clm"] * 3 + ["warm"] * 4,
            "layer": [-1, 0, 1, 2, 3, -1, 0, 1, 0, 1, 2, 3],
        }
    )
    drawn = report.drawn_frozen(frozen, layers)
    # a: the warm-up froze all five layers (not drawn), clm three; b's warm-up left the embeddings training
    assert sorted(map(tuple, drawn.to_numpy().tolist())) == sorted(
        [
            ("a", "clm", -1),
            ("a", "clm", 0),
            ("a", "clm", 1),
            ("b", "warm", 0),
            ("b", "warm", 1),
            ("b", "warm", 2),
            ("b", "warm", 3),
        ]
    )
    assert report.drawn_frozen(None, layers).empty and report.drawn_frozen(frozen.iloc[:0], layers).empty


def test_a_mask_every_arm_shares_is_still_drawn(sweep_copy):
    """The rule is about the layers a phase froze, not about arms: a sweep of one frozen arm shows its mask."""
    runs = read(sweep_copy, "runs")
    rewrite(sweep_copy, "runs", runs[runs["freeze"] == "low"])
    fig, data = report.layers_figure(report.load_sweep(sweep_copy))
    assert data.set_index("layer")["frozen_in"].to_dict() == {-1: "clm", 0: "clm", 1: "clm", 2: "", 3: ""}
    assert [t.get_text() for t in fig.axes[1].get_yticklabels()] == ["low · clm"]


def test_a_sweep_without_a_frozen_table_draws_no_strip(sweep_copy):
    rewrite(sweep_copy, "frozen", None)
    fig, data = report.layers_figure(report.load_sweep(sweep_copy))
    assert (data["frozen_in"] == "").all() and len(fig.axes) == 1


# --- notebooks ---------------------------------------------------------------------------------------------


def test_the_notebooks_are_committed_without_outputs():
    import nbformat

    for path in sorted((ROOT / "analysis_notebooks").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        assert all(
            not c.get("outputs") and c.get("execution_count") is None for c in nb.cells if c.cell_type == "code"
        ), path.name


@pytest.mark.slow
def test_the_compare_notebook_runs_on_two_sweeps(results, monkeypatch):
    """sweep_overview.ipynb runs on a real sweep's tables in tests/test_end_to_end.py."""
    import nbformat
    from nbclient import NotebookClient

    path = ROOT / "analysis_notebooks" / "compare_sweeps.ipynb"
    nb = nbformat.read(path, as_version=4)
    monkeypatch.setenv("ABLATE_SWEEP_DIR", str(results / "sweep_a"))
    monkeypatch.setenv("ABLATE_SWEEP_DIR_B", str(results / "sweep_b"))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    ).execute()
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors


if __name__ == "__main__":  # a quick sweep to look at: python tests/test_report.py OUT_DIR
    import sys

    out = write_sweep(Path(sys.argv[1]))
    for name in TABLE_FIGURES:
        print(report.make_figure(name, out))


def test_ordered_phases(sweep_dir, sweep_copy):
    # training order within each schedule; mlm and head_warmup both come first in their runs (a tie)
    assert report.ordered_phases(report.load_sweep(sweep_dir)) == [
        "mlm",
        "head_warmup",
        "clm",
        "mlm_decay",
        "final",
    ]
    layers = read(sweep_copy, "layers")
    rewrite(sweep_copy, "layers", layers.iloc[::-1])  # rows in reverse: the curves still give the order
    assert report.ordered_phases(report.load_sweep(sweep_copy))[2:] == ["clm", "mlm_decay", "final"]


def test_phase_positions_prefer_curves_and_break_ties_by_row():
    layers = pd.DataFrame({"run_id": ["r"] * 4, "phase": ["mlm_decay", "clm", "final", "extra"]})
    curves = pd.DataFrame({"run_id": ["r", "r"], "phase": ["clm", "mlm_decay"], "step": [0, 10]})
    pos = report.phase_positions(layers, curves)
    assert dict(zip(pos["phase"], pos["position"])) == {"clm": 1, "mlm_decay": 2, "final": 3, "extra": 4}
    pos = report.phase_positions(layers)
    assert pos["position"].tolist() == [1, 2, 3, 4]


def test_a_panel_cannot_be_a_column_another_table_has():
    """A runs column that a scores, layers, curves, grads or frozen column shares (as the run folder's schema
    names them) would clash in the join: refused, naming the ones allowed."""
    from ablate.report.arms import panel_column

    runs = pd.DataFrame({"run_id": ["a"], "model": ["m"], "lr": [1e-4], "n_examples": [3], "grad_norm": [1.0]})
    assert panel_column(runs, "model") == "model"
    for clash in ("lr", "n_examples", "grad_norm"):
        with pytest.raises(SpecError, match="allowed: auto, none, model$"):
            panel_column(runs, clash)
