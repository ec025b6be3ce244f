"""The classification metrics --metrics chooses, against scikit-learn and against counts done by hand."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef, precision_score, recall_score
from transformers import EvalPrediction

from hf_fedflat.metrics.classification import ClassificationMetrics, classification_keys, predicted_ids

RNG = np.random.default_rng(1)
N = 300
LABELS = RNG.integers(0, 4, N)
PREDICTED = np.where(RNG.random(N) < 0.55, LABELS, RNG.integers(0, 4, N))  # about 60% right
LOGITS = np.eye(4)[PREDICTED] + 0.01 * RNG.random((N, 4))


def test_every_metric_equals_scikit_learn_on_the_argmax_of_the_logits():
    got = ClassificationMetrics(("accuracy", "f1", "precision", "recall", "matthews"))(
        EvalPrediction(predictions=LOGITS, label_ids=LABELS))
    expected = {"accuracy": accuracy_score(LABELS, PREDICTED), "matthews": matthews_corrcoef(LABELS, PREDICTED)}
    for name, score in (("f1", f1_score), ("precision", precision_score), ("recall", recall_score)):
        for average in ("macro", "micro"):
            expected[f"{name}_{average}"] = score(LABELS, PREDICTED, average=average)
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, abs=1e-12), key
    assert got["f1_micro"] == pytest.approx(got["accuracy"], abs=1e-12)  # single-label data
    assert isinstance(got["accuracy"], float)


def test_by_hand_on_six_samples():
    # labels 0 0 1 1 2 2, predicted 0 1 1 1 2 0: class 0 tp 1 fp 1 fn 1; class 1 tp 2 fp 1 fn 0; class 2 tp 1 fp 0 fn 1
    labels = np.array([0, 0, 1, 1, 2, 2])
    predicted = np.array([0, 1, 1, 1, 2, 0])
    got = ClassificationMetrics(("accuracy", "precision", "recall", "f1"))(
        EvalPrediction(predictions=predicted, label_ids=labels))  # ids already (a reduced prediction)
    precision = [1 / 2, 2 / 3, 1 / 1]
    recall = [1 / 2, 2 / 2, 1 / 2]
    f1 = [2 * p * r / (p + r) for p, r in zip(precision, recall)]
    assert got["accuracy"] == pytest.approx(4 / 6)
    assert got["precision_macro"] == pytest.approx(np.mean(precision))
    assert got["recall_macro"] == pytest.approx(np.mean(recall))
    assert got["f1_macro"] == pytest.approx(np.mean(f1))
    assert got["precision_micro"] == got["recall_micro"] == got["f1_micro"] == pytest.approx(4 / 6)


def test_two_classes_also_report_the_binary_values_of_class_1():
    # labels 1 1 1 0 0, predicted 1 0 1 1 0: class 1 tp 2 fp 1 fn 1 -> precision 2/3, recall 2/3, f1 2/3
    labels, predicted = np.array([1, 1, 1, 0, 0]), np.array([1, 0, 1, 1, 0])
    got = ClassificationMetrics(("f1", "precision", "recall"), num_classes=2)(
        EvalPrediction(predictions=predicted, label_ids=labels))
    assert got["f1"] == pytest.approx(2 / 3) and got["precision"] == pytest.approx(2 / 3)
    assert got["recall"] == pytest.approx(2 / 3)
    # class 0: tp 1 fp 1 fn 1 -> f1 1/2; macro = (2/3 + 1/2) / 2
    assert got["f1_macro"] == pytest.approx((2 / 3 + 1 / 2) / 2)
    assert list(got) == classification_keys(("f1", "precision", "recall"), num_classes=2)
    assert classification_keys(("f1",), num_classes=2) == ["f1", "f1_macro", "f1_micro"]
    assert "f1" not in ClassificationMetrics(("f1",), num_classes=3)(EvalPrediction(predictions=predicted,
                                                                                     label_ids=labels))


def test_rows_labelled_minus_100_are_left_out_and_a_tuple_gives_its_logits_first():
    labels = np.array([1, -100, 0, 1])
    logits = np.array([[0.0, 1.0], [1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
    got = ClassificationMetrics(("accuracy", "matthews"))(EvalPrediction(predictions=(logits, None), label_ids=labels))
    assert got["accuracy"] == pytest.approx(2 / 3)
    assert got["matthews"] == pytest.approx(matthews_corrcoef([1, 0, 1], [1, 0, 0]))
    assert np.array_equal(predicted_ids(logits, labels), [1, 0, 0, 0])


def test_keys_and_refusals():
    assert classification_keys(("accuracy", "f1", "matthews")) == ["accuracy", "f1_macro", "f1_micro", "matthews"]
    with pytest.raises(ValueError, match="^metrics: "):
        ClassificationMetrics(("perplexity",))
