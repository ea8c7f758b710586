"""The sequence task types: one label per text (sequence_classification) or per pair of texts
(sequence_pair_classification), several labels per text (multi_label_classification: BCE, weighted per label
by negatives / positives in train when multi_label_pos_weight is on; a label is predicted when its sigmoid is
over 0.5), and a number per text (regression). Each pools the sequence as `pooling` says.

May import: config, evaluate (metrics, task_types.entry, task_types.hf).
"""

from __future__ import annotations

import torch

from ablate.config.base import Located
from ablate.evaluate import metrics as m
from ablate.evaluate.task_types.entry import TaskType
from ablate.evaluate.task_types.hf import dense_labels, per_row, sequence_head, text_encoder

RECORD_FORMATS = ("jsonl", "csv", "json", "hf")
SINGLE_LABEL_METRICS = {
    "accuracy": m.accuracy,
    "micro_f1": m.micro_f1,
    "macro_f1": m.macro_f1,
    "weighted_f1": m.weighted_f1,
}
TAKES_NEGATIVE = frozenset({"micro_f1", "macro_f1", "weighted_f1"})


def pos_weight(labels: list[list[float]], n_labels: int) -> torch.Tensor:
    """BCE pos_weight per label: negatives / positives among the training examples. A label that is positive
    in none or in all of them gets 1 (there is nothing to balance)."""
    y = torch.tensor(labels, dtype=torch.float64).reshape(-1, n_labels)
    pos = y.sum(0)
    neg = len(y) - pos
    usable = (pos > 0) & (neg > 0)
    return torch.where(usable, neg / pos.clamp(min=1), torch.ones_like(pos)).float()


def _weighted_bce(settings, train, n_labels: int, device: str):
    if not settings.multi_label_pos_weight:
        return None
    return torch.nn.BCEWithLogitsLoss(pos_weight=pos_weight([it.label for it in train], n_labels).to(device))


def _single(pair: bool):
    def check(task) -> None:
        if pair and task.columns.text_pair is None:
            raise Located("a pair task needs columns.text_pair", "columns.text_pair")
        if not pair and task.columns.text_pair is not None:
            raise Located(
                "a task with text_pair is of type sequence_pair_classification",
                "columns.text_pair",
                task.columns.text_pair,
            )

    return check


def _no_label_set(task) -> None:
    if task.labels.values is not None:
        raise Located("a regression task has no label set", "labels.values", task.labels.values)


PROBE_SETTINGS = frozenset({"probe", "probe_hidden", "probe_dropout"})  # ablate.evaluate.task_types.probe
_SEQUENCE = dict(
    formats=RECORD_FORMATS,
    collate=dense_labels(torch.long),
    reads=frozenset({"pooling"}) | PROBE_SETTINGS,
    lora_task="SEQ_CLS",
    hub_pipeline="text-classification",
)
SEQUENCE_CLASSIFICATION, SEQUENCE_PAIR_CLASSIFICATION = (
    TaskType(
        name=_name,
        description="one label per " + ("pair of texts" if _pair else "text"),
        protocol_kind="classification",
        metrics=SINGLE_LABEL_METRICS,
        selects_by="micro_f1",
        label_kind="one",
        head=sequence_head("single_label_classification"),
        encode=text_encoder(lambda label, labels, label_id: label_id[label]),
        decode=per_row(lambda logits, item, labels, ex: labels[int(logits.argmax())]),
        check=_single(_pair),
        takes_negative=TAKES_NEGATIVE,
        **_SEQUENCE,
    )
    for _name, _pair in (("sequence_classification", False), ("sequence_pair_classification", True))
)

MULTI_LABEL_CLASSIFICATION = TaskType(
    name="multi_label_classification",
    description="a set of labels per text",
    protocol_kind="classification",
    metrics={
        "micro_f1": m.multilabel_micro_f1,
        "macro_f1": m.multilabel_macro_f1,
        "weighted_f1": m.multilabel_weighted_f1,
    },
    selects_by="micro_f1",
    formats=RECORD_FORMATS,
    label_kind="set",
    head=sequence_head("multi_label_classification"),
    encode=text_encoder(lambda label, labels, label_id: [1.0 if lab in label else 0.0 for lab in labels]),
    collate=dense_labels(torch.float),
    loss=_weighted_bce,
    decode=per_row(
        lambda logits, item, labels, ex: tuple(lab for lab, on in zip(labels, (logits > 0).tolist()) if on)
    ),  # sigmoid > 0.5
    label_names=tuple,
    reads=frozenset({"pooling", "multi_label_pos_weight"}) | PROBE_SETTINGS,
    lora_task="SEQ_CLS",
    hub_pipeline="text-classification",
)

REGRESSION = TaskType(
    name="regression",
    description="a number per text (or pair)",
    protocol_kind="classification",
    metrics={"pearson": m.pearson, "spearman": m.spearman},
    selects_by="pearson",
    formats=RECORD_FORMATS,
    label_kind="number",
    head=sequence_head("regression", one_output=True),
    encode=text_encoder(lambda label, labels, label_id: float(label)),
    collate=dense_labels(torch.float),
    decode=per_row(lambda logits, item, labels, ex: float(logits[0])),
    label_names=lambda label: (),
    reads=frozenset({"pooling"}) | PROBE_SETTINGS,
    lora_task="SEQ_CLS",
    hub_pipeline="text-classification",
    has_label_set=False,
    check=_no_label_set,
)

ENTRIES = (SEQUENCE_CLASSIFICATION, SEQUENCE_PAIR_CLASSIFICATION, MULTI_LABEL_CLASSIFICATION, REGRESSION)
