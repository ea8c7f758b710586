import math

import pytest

from ablate.evaluate import metrics, task_types


def test_entity_f1_hand_computed():
    gold = [["B-Disease", "I-Disease", "O", "B-Disease"], ["O", "B-Chemical", "O"]]
    pred = [["B-Disease", "I-Disease", "O", "O"], ["O", "B-Chemical", "B-Disease"]]
    # gold entities: 3; predicted: 3; correct: the two-token Disease and the Chemical -> P = R = 2/3.
    assert metrics.entity_precision(gold, pred) == pytest.approx(2 / 3)
    assert metrics.entity_recall(gold, pred) == pytest.approx(2 / 3)
    assert metrics.entity_f1(gold, pred) == pytest.approx(2 / 3)


def test_entity_f1_partial_span_and_wrong_type_score_nothing():
    gold = [["B-Disease", "I-Disease", "I-Disease", "O"]]
    assert metrics.entity_f1(gold, [["B-Disease", "I-Disease", "O", "O"]]) == 0.0  # span too short
    assert metrics.entity_f1(gold, [["B-Chemical", "I-Chemical", "I-Chemical", "O"]]) == 0.0
    assert metrics.entity_f1(gold, gold) == 1.0


def test_entity_f1_is_strict_iob2():
    gold = [["B-Disease", "I-Disease", "O"]]
    pred = [["I-Disease", "I-Disease", "O"]]  # an entity starting with I-: valid in IOB1/conlleval, not in IOB2
    assert metrics.entity_f1(gold, pred) == 0.0
    from seqeval.metrics import f1_score

    assert f1_score(gold, pred) == 1.0  # the lenient default would have counted it


def test_entity_f1_precision_recall_differ():
    gold = [["B-D", "O", "B-D", "O", "B-D", "I-D"]]
    pred = [["B-D", "O", "O", "O", "B-D", "O"]]
    # gold 3 entities, predicted 2, correct 1 (the first): P = 1/2, R = 1/3, F1 = 2PR/(P+R) = 0.4
    assert metrics.entity_precision(gold, pred) == pytest.approx(0.5)
    assert metrics.entity_recall(gold, pred) == pytest.approx(1 / 3)
    assert metrics.entity_f1(gold, pred) == pytest.approx(0.4)


def test_entity_f1_no_entities_anywhere_is_zero_not_error():
    assert metrics.entity_f1([["O", "O"]], [["O", "O"]]) == 0.0


def test_entity_f1_sentence_length_mismatch_raises():
    with pytest.raises(ValueError, match="sentence 0"):
        metrics.entity_f1([["O", "O"]], [["O"]])


def test_classification_on_a_known_confusion_matrix():
    # rows gold, columns pred:   a  b  c
    #                       a    3  1  0
    #                       b    0  1  1
    #                       c    1  0  3
    gold = ["a"] * 4 + ["b"] * 2 + ["c"] * 4
    pred = ["a", "a", "a", "b"] + ["b", "c"] + ["a", "c", "c", "c"]
    # per-class F1: a 0.75 (P 3/4, R 3/4), b 0.5 (P 1/2, R 1/2), c 0.75 (P 3/4, R 3/4)
    assert metrics.macro_f1(gold, pred) == pytest.approx((0.75 + 0.5 + 0.75) / 3)
    assert metrics.micro_f1(gold, pred) == pytest.approx(0.7)
    assert metrics.accuracy(gold, pred) == pytest.approx(0.7)


def test_macro_f1_counts_a_class_only_predicted():
    # class c never in gold but predicted once: it enters the macro mean with F1 0
    gold, pred = ["a", "a", "b", "b"], ["a", "a", "b", "c"]
    # a: 1.0; b: P 1, R 1/2 -> 2/3; c: 0
    assert metrics.macro_f1(gold, pred) == pytest.approx((1 + 2 / 3 + 0) / 3)


def test_multilabel_micro_f1():
    gold = [("a", "b"), ("c",), ()]
    pred = [("a",), ("c", "d"), ("b",)]
    # TP 2 (a, c), FP 2 (d, b), FN 1 (b in the first) -> 2TP / (2TP + FP + FN) = 4/7
    assert metrics.multilabel_micro_f1(gold, pred) == pytest.approx(4 / 7)
    assert metrics.multilabel_micro_f1(gold, gold) == 1.0


def test_correlations():
    assert metrics.pearson([1, 2, 3, 4], [2, 4, 6, 8]) == pytest.approx(1.0)
    # one swapped pair: Spearman 1 - 6*2/(4*15) = 0.8; Pearson is also 0.8 here (covariance 4, variances 5)
    assert metrics.spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert metrics.pearson([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    # monotone but not linear: rank correlation perfect, linear not
    assert metrics.spearman([1, 2, 3, 4], [1, 4, 9, 100]) == pytest.approx(1.0)
    assert metrics.pearson([1, 2, 3, 4], [1, 4, 9, 100]) < 0.9


def test_correlation_of_a_constant_prediction_is_nan():
    assert math.isnan(metrics.pearson([1, 2, 3], [5, 5, 5]))
    assert math.isnan(metrics.spearman([1, 2, 3], [5, 5, 5]))


def test_length_mismatch_raises():
    with pytest.raises(ValueError, match="2 gold items but 1 predictions"):
        metrics.accuracy(["a", "b"], ["a"])


def test_compute_by_task_type_keeps_order():
    out = task_types.compute("sequence_classification", ["macro_f1", "accuracy"], ["a", "b"], ["a", "a"])
    assert list(out) == ["macro_f1", "accuracy"]
    assert out["accuracy"] == 0.5
    assert set(task_types.METRICS["token_classification"]) >= {"entity_f1"}
    assert set(task_types.METRICS["regression"]) == {"pearson", "spearman"}


def test_f1_without_a_negative_label():
    gold = ["DDI-false", "DDI-false", "DDI-effect", "DDI-int", "DDI-effect"]
    pred = ["DDI-false", "DDI-effect", "DDI-effect", "DDI-false", "DDI-int"]
    # positives: gold 3 (effect, int, effect), predicted 3 (effect, effect, int), correct 1 -> P = R = F1 = 1/3
    assert metrics.micro_f1(gold, pred, negative_label="DDI-false") == pytest.approx(1 / 3)
    assert metrics.micro_f1(gold, pred) == pytest.approx(2 / 5)  # all labels: accuracy
    # per positive class: effect P 1/2 R 1/2 -> 1/2; int P 0 R 0 -> 0: macro 1/4
    assert metrics.macro_f1(gold, pred, negative_label="DDI-false") == pytest.approx(1 / 4)
    # binary: micro F1 over the positive label alone is the F1 of that label
    assert metrics.micro_f1(["1", "0", "1", "1"], ["1", "1", "0", "1"], negative_label="0") == pytest.approx(2 / 3)
    assert metrics.micro_f1(["0", "0"], ["0", "0"], negative_label="0") == 0.0  # no positive anywhere
    scores = task_types.compute("sequence_classification", ["micro_f1", "accuracy"], gold, pred, "DDI-false")
    assert scores == {"micro_f1": pytest.approx(1 / 3), "accuracy": pytest.approx(2 / 5)}


def test_multilabel_weighted_f1_weighs_labels_by_gold_count():
    gold = [("a",), ("a",), ("a", "b"), ()]
    pred = [("a",), (), ("b",), ("b",)]
    # a: gold 3, pred 1, tp 1 -> F1 = 2/4 = 1/2; b: gold 1, pred 2, tp 1 -> F1 = 2/3; weighted (3, 1)
    assert metrics.multilabel_weighted_f1(gold, pred) == pytest.approx((3 * 0.5 + 1 * 2 / 3) / 4)
    assert metrics.multilabel_macro_f1(gold, pred) == pytest.approx((0.5 + 2 / 3) / 2)
