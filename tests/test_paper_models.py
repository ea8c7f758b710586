"""The paper's starting checkpoints: the French grids continue ModernCamemBERT base, the English ones ModernBERT
base; both configs ship with ablate, so the grids validate without a hub, and a hub id whose config cannot be
reached is an exit-2 error naming the grid file and its `model` setting."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import ablate.models.loading as sources
from ablate.cli import main
from ablate.models.loading import load_config, model_layout

REPO = Path(__file__).resolve().parents[1]
MODERNCAMEMBERT = "hub:almanach/moderncamembert-base"
MODERNBERT = "hub:answerdotai/ModernBERT-base"


def _unreachable_hub(monkeypatch):
    """No local cache and no hub: what a machine without network sees for a hub id, without the hub client's
    retries."""

    def offline(*args, **kwargs):
        raise OSError("offline")

    monkeypatch.setattr(sources.AutoConfig, "from_pretrained", offline)


@pytest.mark.parametrize(
    "grid, model",
    [("freeze.yaml", MODERNCAMEMBERT), ("decay.yaml", MODERNCAMEMBERT), ("freeze_en.yaml", MODERNBERT)],
)
def test_each_paper_grid_starts_from_its_languages_checkpoint_and_says_which_table(grid, model):
    text = (REPO / "grids" / grid).read_text(encoding="utf-8")
    assert yaml.safe_load(text)["base"]["model"] == model
    header = " ".join(line.lstrip("# ") for line in text.splitlines() if line.startswith("#"))
    assert (
        ("Reproduces the paper's" in header) if model == MODERNCAMEMBERT else "The paper ran no English" in header
    )


def test_moderncamembert_resolves_offline_from_its_shipped_config(monkeypatch):
    _unreachable_hub(monkeypatch)
    config = load_config(MODERNCAMEMBERT)
    assert (config.model_type, config.num_hidden_layers, config.hidden_size, config.num_attention_heads) == (
        "modernbert",
        22,
        768,
        12,
    )
    assert (config.vocab_size, config.pad_token_id, config.cls_token_id, config.sep_token_id) == (32768, 0, 1, 2)
    assert config.max_position_embeddings == 8192
    family, depth = model_layout(MODERNCAMEMBERT)
    assert (family.name, depth) == ("modernbert", 22)


def test_a_hub_model_whose_config_is_unreachable_is_exit_2_naming_the_setting(tmp_path, monkeypatch, capsys):
    _unreachable_hub(monkeypatch)
    grid = yaml.safe_load((REPO / "grids" / "smoke.yaml").read_text())
    grid["base"]["model"] = "hub:someone/unknown-encoder"
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(grid))
    assert main(["sweep", str(path), "--dry-run", "--results", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: model (= hub:someone/unknown-encoder): cannot load the model's config")
    assert "`hf download someone/unknown-encoder`" in err and "a local folder with its config.json" in err
    assert "moderncamembert-base" in err and "tiny-bert" not in err
