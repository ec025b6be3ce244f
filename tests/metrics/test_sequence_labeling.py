"""Entity-level NER metrics (seqeval) against entities counted by hand, and the -100 positions left out."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import EvalPrediction

from hf_fedflat.metrics.sequence_labeling import SequenceLabelingMetrics, predicted_tags, tag_sequences

NAMES = ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"]
ID = {n: i for i, n in enumerate(NAMES)}


def ids(tags):
    return [ID[t] for t in tags]


def test_entity_scores_by_hand():
    # row 1: labelled PER(0-1), LOC(3); predicted PER(0-1) right, LOC(3) typed PER: 1 right of 2 predicted
    # row 2: labelled LOC(0-1); predicted LOC(0) only (the span is cut): wrong; plus a spurious PER(3)
    labelled = [["B-PER", "I-PER", "O", "B-LOC"], ["B-LOC", "I-LOC", "O", "O"]]
    predicted = [["B-PER", "I-PER", "O", "B-PER"], ["B-LOC", "O", "O", "B-PER"]]
    # labelled entities 3, predicted 4, exact matches 1
    precision, recall = 1 / 4, 1 / 3
    f1 = 2 * precision * recall / (precision + recall)
    tokens_right = 3 + 2  # row 1: 3 of 4; row 2: positions 0 and 2
    label_ids = np.array([ids(r) + [-100] for r in labelled])  # a padded position, not scored
    prediction_ids = np.array([ids(r) + [0] for r in predicted])
    got = SequenceLabelingMetrics(NAMES)(EvalPrediction(predictions=prediction_ids, label_ids=label_ids))
    assert got == {"f1": pytest.approx(f1), "precision": pytest.approx(precision), "recall": pytest.approx(recall),
                   "accuracy": pytest.approx(tokens_right / 8)}


def test_logits_and_first_subtoken_positions():
    # the -100 positions (special tokens, later sub-tokens) are dropped before the tags are read
    labels = np.array([[-100, ID["B-LOC"], -100, ID["O"], -100]])
    logits = np.zeros((1, 5, len(NAMES)))
    for position, tag in enumerate(["O", "B-LOC", "B-PER", "O", "I-PER"]):
        logits[0, position, ID[tag]] = 1.0
    assert tag_sequences(logits, labels, NAMES) == ([["B-LOC", "O"]], [["B-LOC", "O"]])
    got = SequenceLabelingMetrics(NAMES, ("f1", "accuracy"))(EvalPrediction(predictions=logits, label_ids=labels))
    assert got == {"f1": 1.0, "accuracy": 1.0}
    assert torch.equal(predicted_tags(torch.tensor(logits), None), torch.tensor([[0, 1, 3, 0, 4]]))


def test_nothing_predicted_is_zero_not_a_warning():
    labels = np.array([ids(["B-PER", "O"])])
    got = SequenceLabelingMetrics(NAMES)(EvalPrediction(predictions=np.array([ids(["O", "O"])]), label_ids=labels))
    assert got["f1"] == 0.0 and got["precision"] == 0.0 and got["recall"] == 0.0 and got["accuracy"] == 0.5
    with pytest.raises(ValueError, match="^metrics: "):
        SequenceLabelingMetrics(NAMES, ("matthews",))
