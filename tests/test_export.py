"""`ablate export`: a finished run of a real tiny sweep as a Hugging Face folder that transformers loads, its
weights cast with --bf16, a model card whose scores are the `--table scores` numbers, bad input exit 2, and a
push without a hub failing clearly with the folder complete."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from safetensors import safe_open
from safetensors.torch import load_file

from ablate.cli import main
from ablate.config.errors import SpecError
from ablate.release.export import choose_run
from in_process import ablate

REPO = Path(__file__).resolve().parents[1]
FINETUNE = {"epochs": 1, "max_train_examples": 16, "max_eval_examples": 16, "max_length": 32, "batch_size": 8}
FROZEN_ARM = "clm_detour, freeze low_clm"


@pytest.fixture(scope="module")
def finished(tmp_path_factory, data_root):
    """Two arms of tiny BERT (mlm; clm_detour with layers 0-1 frozen in its clm phase), one pretraining seed,
    fine-tuned on ncbi_disease with two seeds (two pairing units: a paired bootstrap), run and collected."""
    root = tmp_path_factory.mktemp("export")
    grid = yaml.safe_load((REPO / "tests" / "grids" / "tiny.yaml").read_text())
    grid["sweep"] = "rel"
    grid["base"]["eval"] = {"tasks": ["ncbi_disease"], "seeds": [0, 1], "finetune": FINETUNE}
    grid["exclude"] = [{"schedule": "mlm", "freeze": "low_clm"}, {"schedule": "clm_detour", "freeze": "none"}]
    path = root / "rel.yaml"
    path.write_text(yaml.safe_dump(grid))
    done = ablate(["sweep", path, "--executor", "debug", "--results", root / "results", "--poll", "0.1"], root)
    assert done.returncode == 0, done.stdout + done.stderr
    runs = pd.read_parquet(root / "results" / "rel" / "runs.parquet")
    return root / "results", root / "results" / "rel", runs


def export(finished, arm: str, out: Path, *extra: str) -> int:
    results, sweep, _ = finished
    return main(["export", str(sweep), arm, "--out", str(out), "--results", str(results), *extra])


def run_id_of(runs: pd.DataFrame, schedule: str, freeze: str) -> str:
    return runs.loc[(runs["schedule"] == schedule) & (runs["freeze"] == freeze), "run_id"].item()


def card_rows(readme: Path) -> dict[str, list[str]]:
    """The card's downstream table: task -> its cells."""
    lines = [
        line
        for line in readme.read_text().split("## Downstream scores", 1)[1].splitlines()
        if line.startswith("| ")
    ]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    assert rows[0][:5] == ["task", "language", "metric", "this run", "arm mean ± std (n)"]
    return {r[0]: r for r in rows[1:]}


@pytest.fixture(scope="module")
def exported(finished, tmp_path_factory):
    out = tmp_path_factory.mktemp("out") / "frozen-arm"
    assert export(finished, FROZEN_ARM, out) == 0
    return out


@pytest.mark.slow
def test_the_folder_loads_with_transformers_as_the_runs_model(finished, exported):
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    _, sweep, runs = finished
    run_dir = sweep / "runs" / run_id_of(runs, "clm_detour", "low_clm")
    model = AutoModelForMaskedLM.from_pretrained(exported)
    assert type(model).__name__ == "BertForMaskedLM" and next(model.parameters()).dtype == torch.float32
    stored = load_file(run_dir / "model" / "model.safetensors")
    assert stored and all(torch.equal(t, load_file(exported / "model.safetensors")[k]) for k, t in stored.items())
    tokenizer = AutoTokenizer.from_pretrained(exported)
    assert (
        tokenizer("Disease mentions in abstracts")["input_ids"]
        == AutoTokenizer.from_pretrained(run_dir / "model")("Disease mentions in abstracts")["input_ids"]
    )
    assert not [p for p in exported.parent.iterdir() if p.name.startswith(".")]  # no temporary folder left


def test_the_card_says_how_the_model_was_made(finished, exported):
    from huggingface_hub import ModelCard

    _, sweep, runs = finished
    card = ModelCard.load(exported / "README.md")
    assert card.data.pipeline_tag == "fill-mask" and card.data.library_name == "transformers"
    assert card.data.language == ["en"] and card.data.license and "ablate" in card.data.tags
    text = card.text
    assert "| 1 | clm | CLM | – | 3 |" in text and "| low | 0, 1 |" in text  # records/frozen.json
    assert "| 2 | mlm_decay | MLM | 0.15 | 2 |" in text and "1-sqrt decay to 0.1 x peak" in text
    run = runs.set_index("run_id").loc[run_id_of(runs, "clm_detour", "low_clm")]
    assert run["token_hash"] in text and "training (pretraining) seed: 17" in text and "data seed" in text
    assert "sha256 `" in text and "transformers" in text.split("## Versions", 1)[1]
    assert "![layers](figures/layers.png)" in text and (exported / "figures" / "layers.png").stat().st_size > 0
    drawn = pd.read_csv(exported / "figures" / "layers.csv")
    assert set(drawn["arm"]) == {FROZEN_ARM, "mlm"}  # the run and its MLM twin
    assert (exported / "ablate" / "spec.json").is_file() and (exported / "ablate" / "frozen.json").is_file()


def test_the_cards_scores_are_the_scores_tables(finished, exported, tmp_path):
    results, sweep, _ = finished
    assert (
        main(["report", str(sweep), "--table", "scores", "--out", str(tmp_path), "--results", str(results)]) == 0
    )
    table = pd.read_csv(tmp_path / "scores.csv")
    mine = table[table["arm"] == FROZEN_ARM].reset_index(drop=True)
    pd.testing.assert_frame_equal(pd.read_csv(exported / "ablate" / "scores.csv"), mine, check_dtype=False)
    rows = card_rows(exported / "README.md")
    assert "average" not in rows and "average" not in set(mine["task"])  # one task: no row repeating it
    for task in ("ncbi_disease",):
        r = mine[mine["task"] == task].iloc[0]
        assert r["test"] == "paired bootstrap" and r["n_pairs"] == 2
        cells = rows[task]
        assert cells[4] == f"{r['mean']:.2f} ± {r['std']:.2f} (n=2)"
        assert cells[5:8] == [
            f"{r['delta']:+.2f}",
            f"[{r['ci_low']:.2f}, {r['ci_high']:.2f}]",
            f"{r['p_value']:.3f}",
        ]
    from huggingface_hub import ModelCard

    [result] = ModelCard.load(exported / "README.md").data.eval_results
    assert (result.dataset_type, result.metric_type, result.dataset_split) == (
        "ncbi_disease",
        "seqeval_f1",
        "test",
    )
    # one pretraining seed: the run's own mean over its fine-tuning seeds is the arm's mean
    assert result.metric_value == pytest.approx(mine.loc[mine["task"] == "ncbi_disease", "mean"].item(), rel=1e-12)


def test_bf16_casts_every_weight(finished, tmp_path):
    from transformers import AutoModelForMaskedLM

    _, sweep, runs = finished
    out = tmp_path / "mlm-bf16"
    assert export(finished, "mlm", out, "--bf16") == 0
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}
    assert next(AutoModelForMaskedLM.from_pretrained(out).parameters()).dtype == torch.bfloat16
    stored = load_file(sweep / "runs" / run_id_of(runs, "mlm", "none") / "model" / "model.safetensors")
    cast = load_file(out / "model.safetensors")
    assert all(torch.equal(t.to(torch.bfloat16), cast[k]) for k, t in stored.items())
    assert "weights in bfloat16" in (out / "README.md").read_text()


def test_an_unknown_arm_is_exit_2_listing_the_known_ones(finished, tmp_path, capsys):
    _, _, runs = finished
    out = tmp_path / "nothing"
    assert export(finished, "clm_detour, freeze high", out) == 2
    err = capsys.readouterr().err
    assert "RUN_OR_ARM" in err and f"arms: mlm, {FROZEN_ARM}" in err
    assert all(rid in err for rid in runs["run_id"])
    assert not out.exists()


def test_a_non_empty_out_needs_force(finished, tmp_path, capsys):
    out = tmp_path / "busy"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert export(finished, "mlm", out) == 2 and "--force" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    assert export(finished, "mlm", out, "--force") == 0
    assert not (out / "notes.txt").exists() and (out / "model.safetensors").is_file()


def test_an_error_midway_leaves_nothing(finished, tmp_path, monkeypatch):
    from ablate.release import export as export_module

    def broken(card):
        raise RuntimeError("disk full")

    monkeypatch.setattr(export_module, "render_card", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        export(finished, "mlm", tmp_path / "half")
    assert list(tmp_path.iterdir()) == []


def test_a_damaged_model_or_an_unknown_baseline_is_exit_2_before_anything_is_written(finished, tmp_path, capsys):
    """Every check before the first write: not even --out's parent folder is made."""
    _, sweep, runs = finished
    out = tmp_path / "parent" / "never"
    assert export(finished, "mlm", out, "--baseline", "no such arm") == 2
    assert "--baseline" in capsys.readouterr().err and not out.parent.exists()
    config = sweep / "runs" / run_id_of(runs, "mlm", "none") / "model" / "config.json"
    whole = config.read_bytes()
    try:
        config.write_bytes(whole[: len(whole) // 2])
        assert export(finished, "mlm", out) == 2
    finally:
        config.write_bytes(whole)
    assert f"{config.parent}: the run's final model is damaged: config.json" in capsys.readouterr().err
    assert not out.parent.exists()


def test_an_arm_with_several_seeds_exports_the_lowest_unless_told():
    runs = pd.DataFrame(
        {
            "run_id": ["a18", "a17", "b17"],
            "schedule": ["clm", "clm", "mlm"],
            "freeze": ["low", "low", "none"],
            "seed": [18, 17, 17],
            "status": ["done"] * 3,
            "twin": ["", "b17", ""],
        }
    )
    lowest = choose_run(runs, "clm, freeze low")
    assert (lowest.run_id, lowest.twin) == ("a17", "b17") and "seeds 17, 18" in lowest.note
    assert (
        choose_run(runs, "clm/low", seed=18).run_id == "a18" and choose_run(runs, "clm/low", seed=18).note is None
    )
    with pytest.raises(SpecError) as exc:
        choose_run(runs, "clm, freeze low", seed=19)
    assert exc.value.key == "--seed" and exc.value.allowed == "17, 18"
    assert choose_run(runs, "b17").arm == "mlm"


@pytest.mark.slow
def test_push_without_a_token_is_exit_2_and_the_folder_is_complete(finished, tmp_path):
    results, sweep, _ = finished
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")}
    env.update(HF_HOME=str(tmp_path / "hf-home"), HF_ENDPOINT="http://127.0.0.1:9")
    out = tmp_path / "to-push"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ablate.cli",
            "export",
            str(sweep),
            "mlm",
            "--out",
            str(out),
            "--results",
            str(results),
            "--push-to-hub",
            "me/tiny-mlm",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "no hub token" in done.stderr and f"{out} is complete" in done.stderr
    assert {"config.json", "model.safetensors", "README.md", "tokenizer.json"} <= {p.name for p in out.iterdir()}


def test_push_to_an_unreachable_hub_is_exit_1_and_the_folder_is_complete(finished, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    out = tmp_path / "to-push"
    assert export(finished, FROZEN_ARM, out, "--push-to-hub", "me/tiny-frozen") == 1
    err = capsys.readouterr().err
    assert "push to me/tiny-frozen at http://127.0.0.1:9 failed" in err and f"{out} is complete" in err
    assert (out / "README.md").is_file() and (out / "model.safetensors").is_file()
    assert "me/tiny-frozen" in (out / "README.md").read_text()  # the card names the repository


def test_a_bad_repository_id_is_exit_2_before_anything_is_written(finished, tmp_path):
    out = tmp_path / "never"
    assert export(finished, "mlm", out, "--push-to-hub", "not a repo") == 2
    assert not out.exists()
