"""Downstream metrics, as pure functions of gold and predicted labels.

`METRICS[task_type][name]` is the registry a task file's `metrics:` list is checked against; every metric
is "higher is better", so the first one of a task can drive early stopping.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from scipy import stats
from seqeval.metrics import f1_score as _seq_f1
from seqeval.metrics import precision_score as _seq_precision
from seqeval.metrics import recall_score as _seq_recall
from seqeval.scheme import IOB2
from sklearn.metrics import accuracy_score, f1_score
from sklearn.preprocessing import MultiLabelBinarizer

Tags = Sequence[Sequence[str]]


def _seqeval(fn, gold: Tags, pred: Tags) -> float:
    _check_lengths(gold, pred)
    for i, (g, p) in enumerate(zip(gold, pred)):
        if len(g) != len(p):
            raise ValueError(f"sentence {i}: {len(g)} gold tags but {len(p)} predicted")
    # strict mode: an entity counts only if its exact span and type match under IOB2 (no IOB1 repair).
    return float(fn([list(s) for s in gold], [list(s) for s in pred], mode="strict", scheme=IOB2,
                    average="micro", zero_division=0))


def entity_f1(gold: Tags, pred: Tags) -> float:
    """Entity-level micro F1 (seqeval, strict IOB2)."""
    return _seqeval(_seq_f1, gold, pred)


def entity_precision(gold: Tags, pred: Tags) -> float:
    return _seqeval(_seq_precision, gold, pred)


def entity_recall(gold: Tags, pred: Tags) -> float:
    return _seqeval(_seq_recall, gold, pred)


def accuracy(gold: Sequence[str], pred: Sequence[str]) -> float:
    _check_lengths(gold, pred)
    return float(accuracy_score(list(gold), list(pred)))


def micro_f1(gold: Sequence[str], pred: Sequence[str], negative_label: str | None = None) -> float:
    """Single-label micro F1 over all classes (equal to accuracy for single-label multi-class), or with
    `negative_label` over the other classes only: BLURB's DDI (DDI-false left out), and for a binary task the
    F1 of its positive class (GAD)."""
    return _f1(gold, pred, "micro", negative_label)


def macro_f1(gold: Sequence[str], pred: Sequence[str], negative_label: str | None = None) -> float:
    """Unweighted mean of per-class F1 over the classes present in gold or predictions (less
    `negative_label`)."""
    return _f1(gold, pred, "macro", negative_label)


def weighted_f1(gold: Sequence[str], pred: Sequence[str], negative_label: str | None = None) -> float:
    """Mean of per-class F1 weighted by each class's gold count (classes of gold or predictions, less
    `negative_label`)."""
    return _f1(gold, pred, "weighted", negative_label)


def _f1(gold, pred, average: str, negative_label: str | None) -> float:
    _check_lengths(gold, pred)
    gold, pred = list(gold), list(pred)
    if negative_label is None:
        return float(f1_score(gold, pred, average=average, zero_division=0))
    positive = [lab for lab in sorted(set(gold) | set(pred)) if lab != negative_label]
    if not positive:
        return 0.0
    return float(f1_score(gold, pred, labels=positive, average=average, zero_division=0))


def multilabel_micro_f1(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> float:
    """Micro F1 over (example, label) decisions; each example has a set of labels (possibly empty)."""
    return _multilabel_f1(gold, pred, "micro")


def multilabel_macro_f1(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> float:
    """Unweighted mean of per-label F1 over the labels of gold or predictions."""
    return _multilabel_f1(gold, pred, "macro")


def multilabel_weighted_f1(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> float:
    """Per-label F1 weighted by each label's gold count (DrBenchmark's MORFITT score, sklearn "weighted")."""
    return _multilabel_f1(gold, pred, "weighted")


def _multilabel_f1(gold, pred, average: str) -> float:
    _check_lengths(gold, pred)
    if not gold:
        raise ValueError("no examples")
    mlb = MultiLabelBinarizer()
    mlb.fit([set(g) | set(p) for g, p in zip(gold, pred)])
    if not len(mlb.classes_):
        return 0.0
    return float(f1_score(mlb.transform([set(g) for g in gold]), mlb.transform([set(p) for p in pred]),
                          average=average, zero_division=0))


def pearson(gold: Sequence[float], pred: Sequence[float]) -> float:
    """Pearson r; NaN when either side is constant (undefined), which early stopping treats as worst."""
    g, p = _floats(gold, pred)
    if np.ptp(g) == 0 or np.ptp(p) == 0:
        return math.nan
    return float(stats.pearsonr(g, p).statistic)


def spearman(gold: Sequence[float], pred: Sequence[float]) -> float:
    g, p = _floats(gold, pred)
    if np.ptp(g) == 0 or np.ptp(p) == 0:
        return math.nan
    return float(stats.spearmanr(g, p).statistic)


def _floats(gold, pred) -> tuple[np.ndarray, np.ndarray]:
    _check_lengths(gold, pred)
    if len(gold) < 2:
        raise ValueError("a correlation needs at least 2 examples")
    return np.asarray(gold, dtype=np.float64), np.asarray(pred, dtype=np.float64)


def _check_lengths(gold, pred) -> None:
    if len(gold) != len(pred):
        raise ValueError(f"{len(gold)} gold items but {len(pred)} predictions")


_CLASSIFICATION: dict[str, Callable] = {"accuracy": accuracy, "micro_f1": micro_f1, "macro_f1": macro_f1,
                                        "weighted_f1": weighted_f1}
# The metrics that take metric_options.negative_label (a task file's `metric_options:`).
TAKES_NEGATIVE_LABEL = frozenset({"micro_f1", "macro_f1", "weighted_f1"})

METRICS: dict[str, dict[str, Callable]] = {
    "token_classification": {"entity_f1": entity_f1, "entity_precision": entity_precision,
                             "entity_recall": entity_recall},
    "sequence_classification": _CLASSIFICATION,
    "sequence_pair_classification": _CLASSIFICATION,
    "multi_label_classification": {"micro_f1": multilabel_micro_f1, "macro_f1": multilabel_macro_f1,
                                   "weighted_f1": multilabel_weighted_f1},
    "regression": {"pearson": pearson, "spearman": spearman},
}


def compute(task_type: str, names: Sequence[str], gold, pred, negative_label: str | None = None) -> dict[str, float]:
    """All the named metrics of one task type, in order; `negative_label` (single-label classification) is
    left out of the F1 averages."""
    table = METRICS[task_type]
    return {name: table[name](gold, pred, negative_label=negative_label)
            if negative_label is not None and name in TAKES_NEGATIVE_LABEL else table[name](gold, pred)
            for name in names}
