"""A small real sweep, start to finish: pretrain three arms of a tiny model on real text, fine-tune them on
a real NER task, add a task afterwards without re-training, draw every figure, run the notebooks."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml
from in_process import ablate

REPO = Path(__file__).resolve().parents[1]
FINETUNE = {"epochs": 1, "max_train_examples": 48, "max_eval_examples": 32, "max_length": 64, "batch_size": 8}


def cli(args: list[str], cwd: Path):
    """`ablate ARGS` run in this process (tests/in_process.py): the process boundary is not what these test."""
    return ablate(args, cwd)


@pytest.fixture(scope="module")
def finished(tmp_path_factory, data_root):
    root = tmp_path_factory.mktemp("e2e")
    grid = yaml.safe_load((REPO / "tests" / "grids" / "tiny.yaml").read_text())
    grid["sweep"] = "e2e"
    grid["base"]["eval"] = {"tasks": ["ncbi_disease"], "seeds": [0, 1], "finetune": FINETUNE}
    path = root / "e2e.yaml"
    path.write_text(yaml.safe_dump(grid))
    result = cli(
        ["sweep", str(path), "--executor", "debug", "--results", str(root / "results"), "--poll", "0.1"], root
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return root, root / "results" / "e2e"


@pytest.mark.slow
def test_every_arm_is_scored_on_the_grid_task(finished):
    _, sweep = finished
    scores = pd.read_parquet(sweep / "scores.parquet")
    runs = pd.read_parquet(sweep / "runs.parquet")
    f1 = scores[(scores["metric"] == "entity_f1") & (scores["split"] == "test")]
    assert set(f1["run_id"]) == set(runs["run_id"]) and len(f1) == 3 * 2
    assert set(f1["language"]) == {"en"} and f1["value"].between(0, 1).all()
    assert {"finetune_seed", "epoch", "wall_time_s"} <= set(scores.columns)
    assert not scores["stale"].any()
    # tiny-bert is a random init with dropout: every phase of every run depends on its seed
    assert runs["seed_independent"].all() and runs["seed_changes"].str.contains("clm: dropout").any()


def test_the_frozen_table_is_each_runs_phase_plan(finished):
    """tiny-bert has 4 layers: `low` is layers 0-1, frozen during clm in the low_clm arm and nowhere else."""
    _, sweep = finished
    runs = pd.read_parquet(sweep / "runs.parquet")
    low = runs.loc[runs["freeze"] == "low_clm", "run_id"].tolist()
    assert len(low) == 1 and "frozen" not in runs.columns
    for frozen in (pd.read_parquet(sweep / "frozen.parquet"), pd.read_csv(sweep / "frozen.csv")):
        assert frozen.columns.tolist() == ["run_id", "phase", "layer"]
        assert list(frozen.itertuples(index=False, name=None)) == [(low[0], "clm", 0), (low[0], "clm", 1)]


@pytest.mark.slow
def test_evaluate_adds_a_task_without_recomputing_the_others(finished):
    root, sweep = finished
    before = {p: p.stat().st_mtime_ns for p in sweep.glob("runs/*/scores/ncbi_disease/seed-*.json")}
    args = ["evaluate", str(sweep), "--task", "ncbi_disease", "--task", "chemprot", "--seeds", "0", "1"]
    for k, v in FINETUNE.items():
        args += ["--set", f"{k}={v}"]
    result = cli(args, root)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "evaluated 3 finished runs" in result.stdout
    assert {p: p.stat().st_mtime_ns for p in before} == before  # ncbi scores read back, not redone
    scores = pd.read_parquet(sweep / "scores.parquet")
    assert scores.groupby("task")["run_id"].nunique().to_dict() == {"chemprot": 3, "ncbi_disease": 3}


@pytest.mark.slow
@pytest.mark.parametrize("figure", ["layers", "deltas", "curves", "freeze"])
def test_report_draws_each_figure_from_the_real_sweep(finished, figure):
    root, sweep = finished
    out = root / "figures"
    result = cli(["report", str(sweep), "--figure", figure, "--out", str(out)], root)
    assert result.returncode == 0, result.stdout + result.stderr
    paths = dict(
        line.split(": ", 1) for line in result.stdout.splitlines() if line.split(": ")[0] in ("png", "svg", "csv")
    )
    assert set(paths) == {"png", "svg", "csv"}
    assert all(Path(p).stat().st_size > 0 for p in paths.values())
    assert not pd.read_csv(paths["csv"]).empty
    if figure == "deltas":  # the summary: each arm's mean and spread over seeds, and its difference in points
        assert "delta_pp" in result.stdout and "clm_detour" in result.stdout


@pytest.mark.slow
def test_report_names_what_is_missing(finished, tmp_path):
    root, sweep = finished
    result = cli(["report", str(sweep), "--figure", "nonsense"], root)
    assert result.returncode == 2 and "layers" in result.stderr and "deltas" in result.stderr


@pytest.mark.slow
def test_the_overview_notebook_runs_on_the_real_sweep(finished, monkeypatch):
    """compare_sweeps.ipynb runs on two different sweeps in tests/test_report.py."""
    import nbformat
    from nbclient import NotebookClient

    _, sweep = finished
    path = REPO / "analysis_notebooks" / "sweep_overview.ipynb"
    nb = nbformat.read(path, as_version=4)
    monkeypatch.setenv("ABLATE_SWEEP_DIR", str(sweep))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    ).execute()
    assert not [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]


@pytest.mark.slow
def test_collect_adds_the_papers_cka_ratio_when_two_mlm_seeds_exist(tmp_path, data_root):
    grid = yaml.safe_load((REPO / "tests" / "grids" / "tiny.yaml").read_text())
    grid.update(sweep="ratio", axes={"schedule": ["mlm", "clm_detour"], "seed": [17, 18]}, exclude=[])
    path = tmp_path / "ratio.yaml"
    path.write_text(yaml.safe_dump(grid))
    result = cli(
        ["sweep", str(path), "--executor", "debug", "--results", str(tmp_path / "r"), "--poll", "0.1"], tmp_path
    )
    assert result.returncode == 0, result.stdout + result.stderr
    collected = cli(["collect", "ratio", "--results", str(tmp_path / "r"), "--cka-ratio", "16"], tmp_path)
    assert collected.returncode == 0, collected.stderr
    layers = pd.read_parquet(tmp_path / "r" / "ratio" / "layers.parquet")
    ratio = layers[layers["measure"] == "cka_ratio_vs_mlm"]
    runs = pd.read_parquet(tmp_path / "r" / "ratio" / "runs.parquet")
    clm = set(runs.loc[runs["schedule"] == "clm_detour", "run_id"])
    assert clm <= set(ratio["run_id"]) and sorted(ratio["layer"].unique()) == [-1, 0, 1, 2, 3]
    assert (ratio["value"] >= 0).all() and ratio["value"].notna().all()
