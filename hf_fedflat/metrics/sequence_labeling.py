"""Token classification (NER) metrics: entity-level precision, recall and F1 by seqeval, and per-token accuracy.

Per evaluation row, the scored positions are those whose label is not ``-100`` (with the default alignment, the
first sub-token of each word: one tag per word; see :mod:`hf_fedflat.data.ner`). Their label ids and predicted
ids (the argmax of the logits, reduced per batch by :func:`predicted_tags`, the Trainer's
``preprocess_logits_for_metrics``) become tag names (``B-PER``, ``I-PER``, ``O``), and seqeval scores the
sequences in its default mode (the CoNLL ``conlleval`` script's rules: an ``I-`` tag after ``O`` starts an entity).
The keys, which the Trainer prefixes with ``eval_`` (the names ``transformers``' NER example reports):

=============  ================================================================================
metric         key
=============  ================================================================================
``f1``         ``f1``: entity-level F1, micro-averaged over every entity of the evaluation set
``precision``  ``precision``: predicted entities that match a labelled one exactly (span and type)
``recall``     ``recall``: labelled entities found exactly
``accuracy``   ``accuracy``: scored tokens whose predicted tag is the label (``O`` included)
=============  ================================================================================

No entity predicted (or none labelled) gives 0, not a warning (``zero_division=0``).

>>> compute = SequenceLabelingMetrics(["O", "B-PER", "I-PER"])
>>> compute(EvalPrediction(predictions=logits, label_ids=labels))   # {"f1", "precision", "recall", "accuracy"}
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["SEQUENCE_LABELING_METRICS", "SequenceLabelingMetrics", "predicted_tags", "tag_sequences"]

SEQUENCE_LABELING_METRICS = ("f1", "precision", "recall", "accuracy")
IGNORE_INDEX = -100


def predicted_tags(logits, labels):
    """The Trainer's ``preprocess_logits_for_metrics``: ``[batch, length]`` predicted ids instead of the
    ``[batch, length, num_labels]`` logits (only the ids are gathered over the evaluation set)."""
    if isinstance(logits, (tuple, list)):
        logits = logits[0]
    return logits.argmax(dim=-1)


def tag_sequences(predictions, label_ids, label_names: Sequence[str]) -> tuple[list[list[str]], list[list[str]]]:
    """``(labelled, predicted)`` tag names per row, at the positions whose label is not ``-100``.

    ``predictions`` are ids (``[rows, length]``) or logits (``[rows, length, num_labels]``; a tuple's first item)."""
    if isinstance(predictions, (tuple, list)):
        predictions = predictions[0]
    predictions = np.asarray(predictions)
    label_ids = np.asarray(label_ids)
    if predictions.ndim == label_ids.ndim + 1:
        predictions = predictions.argmax(axis=-1)
    names = list(label_names)
    labelled, predicted = [], []
    for row_predictions, row_labels in zip(predictions, label_ids):
        scored = row_labels != IGNORE_INDEX
        labelled.append([names[i] for i in row_labels[scored]])
        predicted.append([names[i] for i in row_predictions[scored]])
    return labelled, predicted


class SequenceLabelingMetrics:
    """``Trainer(compute_metrics=...)`` for token classification: the chosen ``names`` of
    :data:`SEQUENCE_LABELING_METRICS` (default all four) over the tags ``label_names`` (index = label id)."""

    def __init__(self, label_names: Sequence[str], names: Sequence[str] = SEQUENCE_LABELING_METRICS):
        unknown = [n for n in names if n not in SEQUENCE_LABELING_METRICS]
        if unknown or not names:
            raise ValueError(f"metrics: {unknown or 'none'} not a token classification metric; choose from "
                             f"{', '.join(SEQUENCE_LABELING_METRICS)}.")
        self.label_names = [str(n) for n in label_names]
        self.names = tuple(names)

    def __call__(self, eval_prediction) -> dict[str, float]:
        from seqeval.metrics import accuracy_score, f1_score, precision_score, recall_score

        labelled, predicted = tag_sequences(eval_prediction.predictions, eval_prediction.label_ids, self.label_names)
        scores = {"f1": lambda: f1_score(labelled, predicted, zero_division=0),
                  "precision": lambda: precision_score(labelled, predicted, zero_division=0),
                  "recall": lambda: recall_score(labelled, predicted, zero_division=0),
                  "accuracy": lambda: accuracy_score(labelled, predicted) if any(labelled) else float("nan")}
        return {name: float(scores[name]()) for name in self.names}
