"""Issue 32: fine-tuning's defaults (batches grouped by length), bf16 autocast on CUDA as for pretraining, and
score identities that keep scores of the old and new defaults apart."""

from __future__ import annotations

import pytest
import torch

import ablate.evaluate.finetune as ft
from ablate.evaluate.identity import _digest, settings_hash
from ablate.evaluate.tasks import FinetuneSettings, load_task, resolve_settings
from ablate.train.precision import autocast_on

SMALL = {"max_train_examples": 24, "max_eval_examples": 8, "epochs": 1, "max_length": 32, "batch_size": 8}


def test_batches_are_grouped_by_length_by_default_and_scores_of_the_old_default_are_kept_apart():
    assert FinetuneSettings().group_by_length is True
    task = load_task("ncbi_disease")
    # FinetuneSettings' default (ncbi's file says false, as BioClinical-ModernBERT's harness shuffles)
    default = ft.resolve_precision(resolve_settings(task, {**SMALL, "group_by_length": True}), "cpu")
    old = ft.resolve_precision(resolve_settings(task, {**SMALL, "group_by_length": False}), "cpu")
    # what a score file of the old default recorded: the hash without the later settings at their neutral values
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
    assert settings_hash(default) != settings_hash(old)


@pytest.mark.parametrize(
    "precision, on_cpu, on_cuda", [("auto", False, True), ("bf16", True, True), ("fp32", False, False)]
)
def test_finetuning_takes_the_autocast_decision_pretraining_takes(precision, on_cpu, on_cuda):
    assert (autocast_on(precision, "cpu"), autocast_on(precision, "cuda")) == (on_cpu, on_cuda)
    settings = FinetuneSettings(precision=precision)
    # a score records the precision it was computed in: CUDA's auto is bf16, anything on the CPU fp32 unless asked
    assert ft.resolve_precision(settings, "cuda").precision == ("bf16" if on_cuda else "fp32")
    assert ft.resolve_precision(settings, "cpu").precision == ("bf16" if on_cpu else "fp32")
    assert (
        settings_hash(ft.resolve_precision(settings, "cuda"))
        == settings_hash(ft.resolve_precision(settings, "cpu"))
    ) == (on_cpu == on_cuda)


def _forward_dtypes(model_dir, task, settings, monkeypatch) -> set[torch.dtype]:
    """The dtypes of the classifier's outputs over a whole fine-tuning (training and evaluation passes)."""
    seen: set[torch.dtype] = set()
    real = ft._load_model

    def load(*a, **k):
        model = real(*a, **k)
        model.classifier.register_forward_hook(lambda _m, _i, out: seen.add(out.dtype))
        return model

    monkeypatch.setattr(ft, "_load_model", load)
    rows = ft.finetune(model_dir, task, 1, settings)
    assert rows and all(r["value"] == r["value"] for r in rows)  # scored, no NaN
    return seen


def test_bf16_runs_every_forward_under_autocast_and_fp32_none(tiny_bert, monkeypatch):
    """The CPU runs the autocast path CUDA takes by default (precision bf16 here, auto there): training and
    evaluation forwards in bf16, the weights float32; fp32 (the CPU's auto) runs none."""
    task = load_task("ncbi_disease")
    assert _forward_dtypes(
        tiny_bert, task, resolve_settings(task, {**SMALL, "precision": "bf16"}), monkeypatch
    ) == {torch.bfloat16}
    assert _forward_dtypes(tiny_bert, task, resolve_settings(task, SMALL), monkeypatch) == {torch.float32}


def test_bf16_on_the_cpu_is_seeded_like_fp32(tiny_bert):
    task = load_task("ncbi_disease")
    s = resolve_settings(task, {**SMALL, "precision": "bf16", "epochs": 2, "lr": 1e-3})
    a, b = ft.finetune(tiny_bert, task, 2, s), ft.finetune(tiny_bert, task, 2, s)
    assert [r["value"] for r in a] == [r["value"] for r in b]


@pytest.mark.slow
def test_data_seed_fixes_batch_order_and_dropout_while_the_seed_draws_the_head(tiny_bert, monkeypatch):
    """The English paper profile's seeding (BioClinical-ModernBERT's Trainer reseeds with 42 once the model is
    built): with data_seed two fine-tuning seeds get other heads but the same batches and the same RNG state for
    dropout."""
    task = load_task("ncbi_disease")
    orders, seeds, heads = [], [], []
    real_batches, real_load = ft.epoch_batches, ft._load_model

    def batches(*a, **k):
        seeds.append(torch.initial_seed())
        orders.append(real_batches(*a, **k))
        return orders[-1]

    def load(*a, **k):
        model = real_load(*a, **k)
        heads.append(model.classifier.weight.detach().clone())
        return model

    monkeypatch.setattr(ft, "epoch_batches", batches)
    monkeypatch.setattr(ft, "_load_model", load)
    small = {**SMALL, "max_train_examples": 16, "max_eval_examples": 4}
    s = resolve_settings(task, {**small, "data_seed": 42, "group_by_length": False})
    ft.finetune(tiny_bert, task, 0, s)
    ft.finetune(tiny_bert, task, 1, s)
    assert orders[0] == orders[1] and seeds == [42, 42] and not torch.equal(heads[0], heads[1])


def test_pooling_model_leaves_the_head_transformers_builds():
    from transformers import ModernBertConfig, ModernBertForSequenceClassification

    from ablate.evaluate.pooling import set_pooling

    config = ModernBertConfig(
        vocab_size=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        cls_token_id=1,
        sep_token_id=2,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        classifier_pooling="mean",  # as answerdotai/ModernBERT-base's config.json says
    )
    model = ModernBertForSequenceClassification(config)
    assert set_pooling(model, "model").config.classifier_pooling == "mean"
    assert set_pooling(model, "cls").config.classifier_pooling == "cls"
