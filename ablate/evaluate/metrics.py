"""Downstream metrics, as pure functions of gold and predicted labels; every one is "higher is better".
Which metrics a task type computes is its entry's (ablate.evaluate.task_types: METRICS, compute).

May import: nothing of ablate.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

# seqeval, scikit-learn and scipy are imported where they are used: together with the pandas and pyarrow they
# pull in they take about a second to import, which every process that never scores (a sweep's driver, a job
# that only pretrains, `ablate prepare`) would pay.

Tags = Sequence[Sequence[str]]


def _seqeval(name: str, gold: Tags, pred: Tags) -> float:
    """Strict IOB2: an entity counts only if its exact span and type match (no IOB1 repair). A word with no
    prediction (None: cut off by max_length) is scored as O, so a cut gold entity is a miss."""
    from seqeval import metrics
    from seqeval.scheme import IOB2

    gold, pred = _tag_lists(gold, pred)
    pred = [["O" if t is None else t for t in p] for p in pred]
    return float(getattr(metrics, name)(gold, pred, mode="strict", scheme=IOB2, average="micro", zero_division=0))


def _seqeval_default(name: str, gold: Tags, pred: Tags) -> float:
    """seqeval's default (conlleval) mode, as `evaluate`'s seqeval computes overall_f1 (BioClinical-ModernBERT's
    harness, src/metrics/metrics.py:54-73): an I- without a B- opens an entity, and the words without a
    prediction (None: cut off by max_length, label -100 in the harness) are left out of gold and predictions."""
    from seqeval import metrics

    gold, pred = _tag_lists(gold, pred)
    kept = [[i for i, t in enumerate(p) if t is not None] for p in pred]
    gold = [[g[i] for i in k] for g, k in zip(gold, kept)]
    pred = [[p[i] for i in k] for p, k in zip(pred, kept)]
    return float(getattr(metrics, name)(gold, pred, average="micro", zero_division=0))


def _tag_lists(gold: Tags, pred: Tags) -> tuple[list[list], list[list]]:
    _check_lengths(gold, pred)
    for i, (g, p) in enumerate(zip(gold, pred)):
        if len(g) != len(p):
            raise ValueError(f"sentence {i}: {len(g)} gold tags but {len(p)} predicted")
    return [list(s) for s in gold], [list(s) for s in pred]


def entity_f1(gold: Tags, pred: Tags) -> float:
    """Entity-level micro F1 (seqeval, strict IOB2; cut words count as O)."""
    return _seqeval("f1_score", gold, pred)


def entity_precision(gold: Tags, pred: Tags) -> float:
    return _seqeval("precision_score", gold, pred)


def entity_recall(gold: Tags, pred: Tags) -> float:
    return _seqeval("recall_score", gold, pred)


def seqeval_f1(gold: Tags, pred: Tags) -> float:
    """Entity-level micro F1 as BioClinical-ModernBERT's harness scores NER: seqeval's default mode over the
    words kept after truncation (`evaluate`'s seqeval overall_f1)."""
    return _seqeval_default("f1_score", gold, pred)


def seqeval_precision(gold: Tags, pred: Tags) -> float:
    return _seqeval_default("precision_score", gold, pred)


def seqeval_recall(gold: Tags, pred: Tags) -> float:
    return _seqeval_default("recall_score", gold, pred)


def accuracy(gold: Sequence[str], pred: Sequence[str]) -> float:
    from sklearn.metrics import accuracy_score

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
    from sklearn.metrics import f1_score

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
    from sklearn.metrics import f1_score
    from sklearn.preprocessing import MultiLabelBinarizer

    _check_lengths(gold, pred)
    if not gold:
        raise ValueError("no examples")
    mlb = MultiLabelBinarizer()
    mlb.fit([set(g) | set(p) for g, p in zip(gold, pred)])
    if not len(mlb.classes_):
        return 0.0
    return float(
        f1_score(
            mlb.transform([set(g) for g in gold]),
            mlb.transform([set(p) for p in pred]),
            average=average,
            zero_division=0,
        )
    )


def pearson(gold: Sequence[float], pred: Sequence[float]) -> float:
    """Pearson r; NaN when either side is constant (undefined), which early stopping treats as worst."""
    g, p = _floats(gold, pred)
    if np.ptp(g) == 0 or np.ptp(p) == 0:
        return math.nan
    from scipy import stats

    return float(stats.pearsonr(g, p).statistic)


def spearman(gold: Sequence[float], pred: Sequence[float]) -> float:
    g, p = _floats(gold, pred)
    if np.ptp(g) == 0 or np.ptp(p) == 0:
        return math.nan
    from scipy import stats

    return float(stats.spearmanr(g, p).statistic)


def _floats(gold, pred) -> tuple[np.ndarray, np.ndarray]:
    _check_lengths(gold, pred)
    if len(gold) < 2:
        raise ValueError("a correlation needs at least 2 examples")
    return np.asarray(gold, dtype=np.float64), np.asarray(pred, dtype=np.float64)


def _check_lengths(gold, pred) -> None:
    if len(gold) != len(pred):
        raise ValueError(f"{len(gold)} gold items but {len(pred)} predictions")


Spans = Sequence[Iterable[tuple[int, int, str]]]


def _span_counts(gold: Spans, pred: Spans) -> tuple[int, int, int]:
    """(true positives, predicted, gold) over (example, start, end, label): exact spans, nested ones kept."""
    _check_lengths(gold, pred)
    g = {(i, *s) for i, spans in enumerate(gold) for s in spans}
    p = {(i, *s) for i, spans in enumerate(pred) for s in spans}
    return len(g & p), len(p), len(g)


def span_precision(gold: Spans, pred: Spans) -> float:
    tp, n_pred, _ = _span_counts(gold, pred)
    return tp / n_pred if n_pred else 0.0


def span_recall(gold: Spans, pred: Spans) -> float:
    tp, _, n_gold = _span_counts(gold, pred)
    return tp / n_gold if n_gold else 0.0


def span_f1(gold: Spans, pred: Spans) -> float:
    """Exact-span micro F1 over (example, start, end, label) triples (character offsets; nested spans are
    separate triples)."""
    tp, n_pred, n_gold = _span_counts(gold, pred)
    return 2 * tp / (n_pred + n_gold) if n_pred + n_gold else 0.0
