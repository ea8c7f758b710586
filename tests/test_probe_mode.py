"""Probing a frozen encoder (finetune.probe: linear | mlp), metrics per group (a task's group_by) and the
needle figure: the encoder bitwise unchanged while the head learns, the MLP's shape, probe refused where no
sequence is pooled, per-group accuracy on a hand case, the score_groups table, the figure's data, the
identity of a probed score."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from ablate.config.base import validate
from ablate.config.errors import SpecError
from ablate.evaluate import finetune as ft
from ablate.evaluate.groups import group_rows
from ablate.evaluate.identity import settings_hash, task_hash
from ablate.evaluate.score_files import evaluate_scores
from ablate.evaluate.task_types.probe import ProbedEncoder, probe_layers
from ablate.evaluate.tasks import FinetuneSettings, TaskSpec, load_task, load_task_data, resolve_settings
from ablate.report.needle import needle_figure
from ablate.report.sweep import Sweep
from ablate.store.collect import collect

NEEDLE = "needle_fr_cpu"
TINY = {
    "epochs": 1,
    "max_train_examples": 8,
    "max_eval_examples": 12,
    "max_length": 32,
    "batch_size": 4,
    "eval_batch_size": 16,
    "subset": "spread",
}


def _captured(monkeypatch) -> dict:
    """ft._load_model wrapped: the model it builds and a copy of its weights as loaded."""
    seen: dict = {}
    load = ft._load_model

    def capture(*args, **kwargs):
        model = load(*args, **kwargs)
        seen["model"], seen["initial"] = model, {k: v.clone() for k, v in model.state_dict().items()}
        return model

    monkeypatch.setattr(ft, "_load_model", capture)
    return seen


@pytest.mark.parametrize("probe", ["linear", "mlp"])
def test_a_probe_leaves_the_encoder_bitwise_unchanged_and_trains_the_head(tiny_bert, monkeypatch, probe):
    from transformers import AutoModel

    seen = _captured(monkeypatch)
    task = load_task(NEEDLE)
    ft.finetune(tiny_bert, task, 0, resolve_settings(task, {**TINY, "probe": probe}))
    model = seen["model"]
    assert isinstance(model, ProbedEncoder)
    # BERT's pooler is absent from an MLM checkpoint (initialised at random on each load) and never read
    loaded = {k: v for k, v in AutoModel.from_pretrained(tiny_bert).state_dict().items() if "pooler" not in k}
    after = model.encoder.state_dict()
    assert loaded and all(torch.equal(after[k], loaded[k]) for k in loaded)
    assert all(p.grad is None and not p.requires_grad for p in model.encoder.parameters())
    head = {k: v for k, v in model.state_dict().items() if k.startswith("head.")}
    assert head and all(not torch.equal(v, seen["initial"][k]) for k, v in head.items() if v.ndim == 2)
    model.train()
    assert model.head.training and not model.encoder.training  # no dropout inside a frozen encoder


def test_the_mlp_probe_is_dropout_linear_gelu_dropout_linear(tiny_bert):
    layers = probe_layers("mlp", 32, 2, None, 0.1)
    assert [type(m).__name__ for m in layers] == ["Dropout", "Linear", "GELU", "Dropout", "Linear"]
    assert (layers[1].in_features, layers[1].out_features, layers[4].out_features) == (32, 32, 2)
    assert layers[0].p == layers[3].p == 0.1
    assert [type(m).__name__ for m in probe_layers("linear", 32, 5, None, 0.0)] == ["Dropout", "Linear"]
    task = load_task(NEEDLE)
    labels = load_task_data(task).labels
    model = ft._load_model(tiny_bert, task, labels, resolve_settings(task, {"probe": "mlp", "probe_hidden": 16}))
    assert (model.head[1].in_features, model.head[1].out_features, model.head[4].out_features) == (32, 16, 2)


def test_a_probe_where_nothing_is_pooled_is_refused(tmp_path):
    ner = load_task("ncbi_disease").model_dump(mode="json")
    for settings in ({"probe": "mlp"}, {"probe": "linear"}):
        with pytest.raises(SpecError, match="never read: a token_classification task never is probed"):
            validate(TaskSpec, {**ner, "finetune": settings}, "ner.yaml", "task file")
    (tmp_path / "ner.yaml").write_text(json.dumps({**ner, "name": "ner", "finetune": {"probe": "mlp"}}))
    from ablate.cli import main

    assert main(["evaluate", "--task", str(tmp_path / "ner.yaml"), "--results", str(tmp_path)]) == 2
    with pytest.raises(SpecError, match="no LoRA adapters"):
        resolve_settings(load_task(NEEDLE), {"method": "lora"})
    with pytest.raises(SpecError, match="probe_hidden sizes the MLP probe"):
        resolve_settings(load_task(NEEDLE), {"probe": "linear", "probe_hidden": 8})


def test_metrics_per_length_position_and_cell_on_a_hand_case():
    task = load_task(NEEDLE)
    groups = [("512", "start"), ("512", "end"), ("1024", "start"), ("1024", "end"), ("512", "start")]
    gold = ["present", "absent", "present", "absent", "absent"]
    preds = ["present", "present", "absent", "absent", "absent"]
    got = {
        (r["group_by"], r["group"]): (r["value"], r["n_examples"])
        for r in group_rows(task, "test", groups, gold, preds)
    }
    assert got == {
        ("length", "512"): (2 / 3, 3),
        ("length", "1024"): (0.5, 2),
        ("position", "start"): (2 / 3, 3),
        ("position", "end"): (0.5, 2),
        ("length,position", "512,start"): (1.0, 2),
        ("length,position", "512,end"): (0.0, 1),
        ("length,position", "1024,start"): (0.0, 1),
        ("length,position", "1024,end"): (1.0, 1),
    }
    assert group_rows(load_task("chemprot"), "test", [()] * 2, ["a", "b"], ["a", "a"]) == []


def test_group_scores_reach_the_score_file_and_the_score_groups_table(tmp_path, tiny_bert):
    base = tmp_path / "sweep" / "base" / "base-tiny"
    base.mkdir(parents=True)
    (base / "source.json").write_text(json.dumps({"model": tiny_bert}))
    rows = evaluate_scores(tiny_bert, [NEEDLE], [0], TINY, base / "scores")
    record = json.loads((base / "scores" / NEEDLE / "seed-0.json").read_text())
    test = [r for r in record["groups"] if r["split"] == "test"]
    for by in ("length", "position", "length,position"):
        assert sum(r["n_examples"] for r in test if r["group_by"] == by) == TINY["max_eval_examples"]
    overall = next(r["value"] for r in rows if r["split"] == "test" and r["metric"] == "accuracy")
    by_length = [r for r in test if r["group_by"] == "length"]
    assert np.isclose(sum(r["value"] * r["n_examples"] for r in by_length) / TINY["max_eval_examples"], overall)
    table = collect(tmp_path / "sweep").tables["score_groups"]
    assert len(table) == len(record["groups"]) and set(table["run_id"]) == {"base-tiny"}
    assert {"length", "position", "length,position"} == set(table["group_by"])


def test_the_needle_figure_means_each_arm_over_seeds(tmp_path):
    runs = pd.DataFrame(
        {
            "run_id": ["m0", "m1", "c0"],
            "schedule": ["mlm", "mlm", "clm_detour"],
            "freeze": ["none"] * 3,
            "status": ["done"] * 3,
        }
    )
    rows = []
    for run, base in (("m0", 0.5), ("m1", 0.7), ("c0", 0.9)):
        for by, group, shift in (
            ("length", "1024", -0.2),
            ("length", "512", 0.0),
            ("position", "end", -0.1),
            ("position", "start", 0.0),
            ("length,position", "512,start", 0.0),
        ):
            rows.append(
                {
                    "run_id": run,
                    "task": NEEDLE,
                    "finetune_seed": 0,
                    "split": "test",
                    "metric": "accuracy",
                    "group_by": by,
                    "group": group,
                    "value": base + shift,
                    "n_examples": 10,
                }
            )
    sweep = Sweep(path=tmp_path, runs=runs, score_groups=pd.DataFrame(rows), baseline="mlm")
    fig, data = needle_figure(sweep)
    mlm = data[data["arm"] == "mlm"].set_index(["group_by", "group"])["mean"]
    assert list(data.loc[data["arm"] == "mlm", "group"]) == ["512", "1024", "start", "end"]
    assert np.allclose(mlm.to_numpy(), [60.0, 40.0, 60.0, 50.0])
    assert list(dict.fromkeys(data["arm"])) == ["mlm", "clm_detour"] and set(data["n"]) == {1, 2}
    by_length, by_position = fig.axes[:2]
    assert [c.get_label() for c in by_length.containers] == ["mlm", "clm_detour"]
    assert np.allclose(by_length.containers[1].lines[0].get_ydata(), [90.0, 70.0])
    bars = [c for c in by_position.containers if c.get_label() == "clm_detour" and hasattr(c, "patches")]
    assert np.allclose([p.get_height() for p in bars[0].patches], [90.0, 80.0])
    with pytest.raises(SpecError, match="no scores by length and by position"):
        needle_figure(sweep, task="chemprot")


def test_a_probed_score_is_not_a_fine_tuned_one():
    full = FinetuneSettings()
    probed = [
        FinetuneSettings(probe="linear"),
        FinetuneSettings(probe="mlp"),
        FinetuneSettings(probe="mlp", probe_dropout=0.2),
    ]
    assert len({settings_hash(s) for s in (full, *probed)}) == 4
    needle = load_task(NEEDLE)
    assert task_hash(needle) != task_hash(needle.model_copy(update={"group_by": None}))
    assert resolve_settings(needle, protocol="paper").probe == "mlp"
