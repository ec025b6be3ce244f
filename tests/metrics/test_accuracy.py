"""Accuracy, the trainer's default metric and the diagnostics' per-client view, against numpy by hand."""

from __future__ import annotations

import numpy as np
import pytest
from transformers import EvalPrediction

from hf_fedflat.metrics import accuracy_metrics, correct_predictions, logits_of, per_client_accuracy

RNG = np.random.default_rng(0)
N = 200
REFERENCES = RNG.integers(0, 5, N)
# about 60% right, so every statistic is away from 0 and 1
PREDICTIONS = np.where(RNG.random(N) < 0.6, REFERENCES, RNG.integers(0, 5, N))
LOGITS = np.eye(5)[PREDICTIONS] + 0.01 * RNG.random((N, 5))
# unequal client sizes: global accuracy and the mean of client accuracies differ
CLIENTS = np.repeat(np.arange(4), [110, 50, 30, 10])


def test_accuracy_metrics_is_top1_accuracy_of_the_logits():
    assert accuracy_metrics(EvalPrediction(predictions=LOGITS, label_ids=REFERENCES)) == {
        "accuracy": pytest.approx(np.mean(PREDICTIONS == REFERENCES), abs=1e-12)}
    # a model with several outputs: the logits come first
    several = EvalPrediction(predictions=(LOGITS, np.zeros((N, 3))), label_ids=REFERENCES)
    assert accuracy_metrics(several) == accuracy_metrics(EvalPrediction(predictions=LOGITS, label_ids=REFERENCES))
    assert logits_of((LOGITS, None)) is LOGITS and logits_of(LOGITS) is LOGITS


def test_per_client_accuracy_matches_numpy():
    correct = correct_predictions(EvalPrediction(predictions=LOGITS, label_ids=REFERENCES))
    hits = PREDICTIONS == REFERENCES
    assert np.array_equal(correct, hits)
    client_indices = [np.flatnonzero(CLIENTS == c) for c in range(4)] + [np.array([], dtype=np.int64)]  # one empty
    result = per_client_accuracy(correct, client_indices)
    per_client = np.array([hits[CLIENTS == c].mean() for c in range(4)])
    assert result["client_accuracy_mean"] == pytest.approx(per_client.mean(), abs=1e-12)
    assert result["client_accuracy_std"] == pytest.approx(per_client.std(), abs=1e-12)
    assert result["train_accuracy_all"] == pytest.approx(hits.mean(), abs=1e-12)
    assert abs(result["train_accuracy_all"] - result["client_accuracy_mean"]) > 1e-3  # the two views really differ
