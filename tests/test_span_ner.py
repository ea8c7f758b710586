"""span_ner: the BRAT reader keeps nested entities, BIOUL tags round-trip, the CRF against brute force, the
overlap filter, span F1, and the span model fine-tuned on a few QUAERO EMEA lines."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

import ablate.evaluate.finetune as ft
from ablate.evaluate import metrics
from ablate.evaluate.brat import read_folder
from ablate.evaluate.crf import BIOULCRF, bioul_constraints
from ablate.evaluate.spans import bioul_spans, bioul_tags, drop_same_label_overlaps, non_overlapping
from ablate.evaluate.tasks import load_task, resolve_settings


def test_the_brat_reader_keeps_nested_entities(data_root):
    lines, counts = read_folder(Path(data_root) / "quaero_brat" / "train" / "EMEA")
    # 318.ann: T6 "principe actif" (CHEM 109-123) and T7 "ziconotide" (CHEM 124-134) are beside each other;
    # "douleurs intenses , chroniques" holds the DISO "douleurs": a nested pair.
    text, spans = next((t, s) for t, s in lines if "douleurs intenses" in t)
    outer = [(s, e, k) for s, e, k in spans if text[s:e].startswith("douleurs intenses")]
    inner = [(s, e, k) for s, e, k in spans if text[s:e] == "douleurs"]
    assert outer and inner and any(o[0] <= i[0] and i[1] <= o[1] for o in outer for i in inner)
    assert counts.entities == 2695 and counts.kept == 2695  # SOURCE.md's count of train EMEA T lines


def test_bioul_round_trip():
    spans = [(0, 0), (2, 4), (6, 7)]
    tags = bioul_tags(spans, 9)
    assert "".join("OBILU"[t] for t in tags) == "UOBILOBLO"
    assert bioul_spans(tags) == spans
    assert non_overlapping([(1, 5), (2, 3), (6, 6)]) == [(1, 5), (6, 6)]  # a nested one leaves the tags


def _paths(length: int):
    return itertools.product(range(5), repeat=length)


def test_the_crf_partition_and_marginals_match_brute_force():
    torch.manual_seed(0)
    crf = BIOULCRF()
    with torch.no_grad():
        crf.transitions.normal_()
    length = 4
    emissions = torch.randn(2, length, 5, dtype=torch.float64)
    mask = torch.tensor([[True] * 4, [True, True, True, False]])
    crf.double()
    trans, start, end = (a.double() for a in bioul_constraints())
    for row in range(2):
        n = int(mask[row].sum())
        scores = {}
        for path in _paths(n):
            tags = torch.tensor([path + (0,) * (length - n)])
            scores[path] = crf.score(emissions[row : row + 1], tags, mask[row : row + 1])[0]
        log_z = torch.logsumexp(torch.stack(list(scores.values())), 0)
        assert torch.allclose(crf.log_partition(emissions[row : row + 1], mask[row : row + 1])[0], log_z)
        allowed = {p: s for p, s in scores.items() if s > -1e3}  # BIOUL forbids the others
        assert all(bioul_tags(bioul_spans(p), n) == list(p) for p in allowed)
        marg = crf.marginals(emissions[row : row + 1], mask[row : row + 1])[0].exp()
        for t in range(n):
            for tag in range(5):
                brute = sum((s - log_z).exp() for p, s in scores.items() if p[t] == tag)
                assert torch.allclose(marg[t, tag], brute, atol=1e-9)
    assert trans[0, 2] < -1e3 and start[2] < -1e3 and end[1] < -1e3  # O->I, start with I, end on B


def test_the_overlap_filter_keeps_the_better_span_of_a_label_and_nests_across_labels():
    kept = drop_same_label_overlaps(
        [(0.9, 0, 10, "DISO"), (0.8, 5, 15, "DISO"), (0.7, 0, 4, "ANAT"), (0.6, 10, 12, "DISO")]
    )
    assert kept == [(0, 4, "ANAT"), (0, 10, "DISO"), (10, 12, "DISO")]


def test_span_f1_on_hand_cases():
    gold = [((0, 4, "A"), (0, 10, "B")), ((3, 5, "A"),)]
    pred = [((0, 4, "A"), (0, 9, "B")), ((3, 5, "A"), (6, 7, "A"))]
    assert metrics.span_precision(gold, pred) == 0.5 and metrics.span_recall(gold, pred) == 2 / 3
    assert metrics.span_f1(gold, pred) == pytest.approx(2 * 2 / (4 + 3))
    assert metrics.span_f1([()], [()]) == 0.0


SMALL = {
    "max_train_examples": 8,
    "max_eval_examples": 6,
    "max_steps": 4,
    "eval_every": 2,
    "batch_size": 4,
    "max_length": 32,
    "lstm_hidden_size": 32,
    "lstm_layers": 1,
    "biaffine_hidden_size": 8,
    "max_span_length": 8,
    "head_lr": 3e-3,
    "lr": 1e-3,
}


def test_the_span_model_trains_on_quaero_emea(tiny_bert, data_root):
    task = load_task("quaero_emea_spans")
    settings = resolve_settings(task, SMALL)
    losses = []
    seen = []
    rows = ft.finetune(
        tiny_bert,
        task,
        0,
        settings,
        data_root,
        progress=lambda p: losses.append(p["loss"]),
        on_predictions=lambda split, gold, pred: seen.append((split, gold, pred)),
    )
    again = ft.finetune(tiny_bert, task, 0, settings, data_root)
    scores = {(r["split"], r["metric"]): r["value"] for r in rows}
    assert set(scores) == {(s, m) for s in ("dev", "test") for m in task.metrics}
    assert [r["value"] for r in rows] == [r["value"] for r in again]  # deterministic by seed
    assert losses[-1] < losses[0]
    split, gold, pred = seen[1]
    assert split == "test" and len(gold) == len(pred) == 6
    assert any(
        len({(s, e) for s, e, _ in g}) < len(g)
        or any(a[0] <= b[0] and b[1] <= a[1] and a != b for a in g for b in g)
        for g in gold
    )  # nested gold spans are scored as they are
    assert all(isinstance(p, tuple) for p in pred)
