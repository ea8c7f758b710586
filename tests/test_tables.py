"""The paper's results tables (`ablate report --table scores|freeze`) on a schema-true synthetic sweep:
numbers equal direct computations, significance marks follow the bootstrap, bad input exits 2."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from ablate import report
from ablate.cli import main
from ablate.config.errors import SpecError
from ablate.evaluate.bootstrap import paired_bootstrap
from tests.test_report import write_sweep


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    return write_sweep(tmp_path_factory.mktemp("tables") / "s", clm_gain=0.03)


def _units(sweep_dir, schedule, freeze, task):
    sc = pd.read_parquet(sweep_dir / "scores.parquet").merge(
        pd.read_parquet(sweep_dir / "runs.parquet"), on="run_id"
    )
    metric = {"ner_a": "f1", "cls_b": "accuracy", "sts_c": "pearson"}[task]
    sc = sc[
        (sc["status"] == "done")
        & (sc["split"] == "test")
        & (sc["metric"] == metric)
        & (sc["schedule"] == schedule)
        & (sc["freeze"] == freeze)
        & (sc["task"] == task)
    ]
    return (100 * sc.set_index(["seed", "finetune_seed"])["value"]).sort_index()


def test_scores_table_equals_direct_computations(sweep_dir):
    table = report.score_table(report.load_sweep(sweep_dir))
    row = table[(table["arm"] == "clm") & (table["task"] == "ner_a")].iloc[0]
    arm, base = _units(sweep_dir, "clm", "none", "ner_a"), _units(sweep_dir, "mlm", "none", "ner_a")
    boot = paired_bootstrap(arm.to_numpy(), base.loc[arm.index].to_numpy())
    assert row["mean"] == pytest.approx(arm.mean()) and row["std"] == pytest.approx(arm.std()) and row["n"] == 9
    assert (row["delta"], row["ci_low"], row["ci_high"], row["p_value"]) == pytest.approx(
        (boot.delta, boot.ci_low, boot.ci_high, boot.p_value)
    )
    assert row["p_value"] < 0.01  # a 3-point gain against 1-point noise, paired over 9 units
    assert set(table["task"]) == {"ner_a", "cls_b", "sts_c", "average"} and set(table["language"]) == {"en", "all"}
    base_rows = table[table["arm"] == "mlm"]
    assert base_rows["delta"].isna().all() and (base_rows["test"] == "baseline").all()


def test_scores_table_files_mark_significance_and_bold_the_best(sweep_dir, tmp_path):
    paths = report.make_table("scores", sweep_dir, tmp_path)
    assert sorted(paths) == ["csv", "md", "tex"] and all(p.is_file() for p in paths.values())
    rows = [line.strip("|").split("|") for line in paths["md"].read_text().splitlines() if line.startswith("| ")]
    cells = {r[0].strip(): [c.strip() for c in r[1:]] for r in rows[2:]}
    tidy = pd.read_csv(paths["csv"])
    for col, task in enumerate(["ner_a", "cls_b", "sts_c", "average"]):
        best = tidy.loc[tidy.loc[tidy["task"] == task, "mean"].idxmax(), "arm"]
        assert [arm for arm, c in cells.items() if c[col].startswith("**")] == [best]
    assert all(c.endswith("**)") for c in cells["clm"])  # +2 to +3 points against 1-point noise: p < 0.01
    assert not any("(" in c for c in cells["mlm"])  # the baseline has no difference
    tex = paths["tex"].read_text()
    assert "\\toprule" in tex and "\\textbf{" in tex and "$\\pm$" in tex and "\\multicolumn{3}{c}{en}" in tex
    assert {"arm", "task", "mean", "std", "n", "delta", "ci_low", "ci_high", "p_value"} <= set(tidy.columns)


def test_identical_arms_get_p_one(sweep_dir, tmp_path):
    scores = pd.read_parquet(sweep_dir / "scores.parquet")
    runs = pd.read_parquet(sweep_dir / "runs.parquet")
    copy = write_sweep(tmp_path / "same")
    twin = runs[(runs["schedule"] == "mlm")].assign(freeze="copy", run_id=lambda d: d["run_id"] + "-copy")
    twin_scores = scores[scores["run_id"].isin(runs.loc[runs["schedule"] == "mlm", "run_id"])].assign(
        run_id=lambda d: d["run_id"] + "-copy"
    )
    for name, frame in (("runs", pd.concat([runs, twin])), ("scores", pd.concat([scores, twin_scores]))):
        frame.to_parquet(copy / f"{name}.parquet", index=False)
        (copy / f"{name}.csv").unlink()
    table = report.score_table(report.load_sweep(copy))
    same = table[(table["schedule"] == "mlm") & (table["freeze"] == "copy")]
    assert len(same) == 4 and (same["delta"] == 0).all() and (same["p_value"] == 1.0).all()


def test_freeze_table_names_what_each_arm_froze(sweep_dir):
    table = report.freeze_table(report.load_sweep(sweep_dir)).set_index(["schedule", "freeze"])
    assert table.loc[("clm", "low"), "frozen"] == "clm: emb,0-1"
    assert table.loc[("clm", "decay_low"), "frozen"] == "mlm_decay: 0-1"
    assert table.loc[("clm", "none"), "frozen"] == "-"  # the head warm-up froze everything: not an arm's mask
    assert np.isnan(table.loc[("clm", "none"), "delta_vs_unfrozen"])
    low = _units(sweep_dir, "clm", "low", "ner_a")  # 6 units: seed 2 of this arm failed
    assert len(low) == 6 and table.loc[("clm", "low"), "n"] == 6


def test_bad_baseline_and_table_names_exit_2(sweep_dir, capsys):
    with pytest.raises(SpecError, match="baseline arm has no scores"):
        report.score_table(report.load_sweep(sweep_dir), baseline="nope")
    assert main(["report", str(sweep_dir), "--table", "bogus"]) == 2
    assert "allowed: scores, freeze" in capsys.readouterr().err
    assert main(["report", str(sweep_dir), "--table", "scores", "--baseline", "nope"]) == 2
    assert main(["report", str(sweep_dir), "--table", "scores"]) == 0
    assert "| clm |" in capsys.readouterr().out


def test_pretraining_seeds_that_are_not_replicates_pair_on_fine_tuning_seeds(tmp_path):
    """Runs whose pretraining seed changes nothing independent (records' seed_independent False): the scores of
    the three pretraining seeds are averaged into each fine-tuning seed, and the bootstrap pairs 3 units."""
    path = write_sweep(tmp_path / "s", clm_gain=0.03, seed_independent=False)
    table = report.score_table(report.load_sweep(path))
    row = table[(table["arm"] == "clm") & (table["task"] == "ner_a")].iloc[0]
    arm = _units(path, "clm", "none", "ner_a").groupby("finetune_seed").mean()
    base = _units(path, "mlm", "none", "ner_a").groupby("finetune_seed").mean()
    boot = paired_bootstrap(arm.to_numpy(), base.loc[arm.index].to_numpy())
    assert row["n"] == 3 and row["units"] == "finetune_seed" and row["n_pairs"] == 3
    assert (row["delta"], row["p_value"]) == pytest.approx((boot.delta, boot.p_value))
    assert "(fine-tuning seed)" in report.make_table("scores", path, tmp_path / "t")["md"].read_text()


def test_tasks_option_limits_the_columns_and_a_task_without_scores_exits_2(sweep_dir, capsys, tmp_path):
    sweep = report.load_sweep(sweep_dir)
    table = report.score_table(sweep, tasks=["ner_a"])
    assert set(table["task"]) == {"ner_a"}  # one task: no average row repeating it
    ner = table[(table["arm"] == "clm") & (table["task"] == "ner_a")].iloc[0]
    freeze = report.make_table("freeze", sweep_dir, tmp_path, tasks=["ner_a"])["csv"]
    assert pd.read_csv(freeze).set_index("arm").loc["clm", "mean"] == pytest.approx(ner["mean"])  # on that task
    two = report.score_table(sweep, tasks=["ner_a", "cls_b"])
    assert set(two["task"]) == {"ner_a", "cls_b", "average"}
    assert main(["report", str(sweep_dir), "--table", "freeze", "--set", "tasks=[ner_a, nope]"]) == 2
    err = capsys.readouterr().err
    assert "no scores for task 'nope'" in err and "cls_b, ner_a, sts_c" in err


def test_the_base_model_is_a_reference_row_over_its_fine_tuning_seeds(sweep_dir, tmp_path):
    """`ablate evaluate --base` rows (schedule "base", no pretraining seed) get a row of their own, compared with
    the baseline per fine-tuning seed (the baseline averaged over its pretraining seeds)."""
    path = write_sweep(tmp_path / "s", clm_gain=0.03)
    runs, scores = (pd.read_parquet(path / f"{n}.parquet") for n in ("runs", "scores"))
    ref = scores[scores["run_id"] == runs["run_id"].iloc[0]].assign(
        run_id="base-tiny", value=lambda d: d["value"] - 0.05
    )
    row = {"run_id": "base-tiny", "sweep": path.name, "schedule": "base", "freeze": "none", "status": "done"}
    for name, frame in (("runs", pd.concat([runs, pd.DataFrame([row])])), ("scores", pd.concat([scores, ref]))):
        frame.to_parquet(path / f"{name}.parquet", index=False)
        (path / f"{name}.csv").unlink()
    table = report.score_table(report.load_sweep(path))
    got = table[(table["arm"] == "base") & (table["task"] == "ner_a")].iloc[0]
    mine = (
        100
        * ref[(ref["task"] == "ner_a") & (ref["split"] == "test") & (ref["metric"] == "f1")]
        .set_index("finetune_seed")["value"]
        .sort_index()
    )
    base = _units(path, "mlm", "none", "ner_a").groupby("finetune_seed").mean()
    assert got["n"] == 3 and got["mean"] == pytest.approx(mine.mean())
    assert got["delta"] == pytest.approx((mine - base).mean()) and got["n_pairs"] == 3
