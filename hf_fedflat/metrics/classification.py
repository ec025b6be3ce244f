"""Classification metrics a run can choose (``--metrics accuracy,f1,precision,recall,matthews``), by scikit-learn.

One value per sample: the argmax of the logits (or the predicted ids when the Trainer's
``preprocess_logits_for_metrics`` already reduced them) against ``label_ids``; samples labelled ``-100`` are left
out. The keys, which the Trainer prefixes with ``eval_``:

=============  ====================================================================
metric         keys
=============  ====================================================================
``accuracy``   ``accuracy``
``f1``         ``f1_macro`` (unweighted mean over the classes), ``f1_micro`` (over all samples)
``precision``  ``precision_macro``, ``precision_micro``
``recall``     ``recall_macro``, ``recall_micro``
``matthews``   ``matthews`` (Matthews correlation coefficient, multi-class)
=============  ====================================================================

With two classes, ``f1``, ``precision`` and ``recall`` also report the binary value of class 1 under the
metric's own name (``f1``: GLUE's and scikit-learn's ``average="binary"``), before the two averages.

The macro averages run over the classes present in the labels or the predictions (scikit-learn's default); a
class never predicted counts 0 (``zero_division=0``). For single-label data the micro averages equal the accuracy.

>>> compute = ClassificationMetrics(("accuracy", "f1"))
>>> compute(EvalPrediction(predictions=logits, label_ids=labels))   # {"accuracy", "f1_macro", "f1_micro"}
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["CLASSIFICATION_METRICS", "ClassificationMetrics", "classification_keys", "predicted_ids"]

CLASSIFICATION_METRICS = ("accuracy", "f1", "precision", "recall", "matthews")
_AVERAGED = ("f1", "precision", "recall")
_AVERAGES = ("macro", "micro")
IGNORE_INDEX = -100


def _averages(num_classes: int | None) -> tuple[str, ...]:
    return ("binary", *_AVERAGES) if num_classes == 2 else _AVERAGES


def _key(name: str, average: str) -> str:
    return name if average == "binary" else f"{name}_{average}"


def classification_keys(names: Sequence[str], num_classes: int | None = None) -> list[str]:
    """The keys the metrics ``names`` report (see the module doc), in their order; with ``num_classes`` 2 the
    binary values too."""
    return [key for n in names
            for key in ([_key(n, a) for a in _averages(num_classes)] if n in _AVERAGED else [n])]


def predicted_ids(predictions, label_ids: np.ndarray) -> np.ndarray:
    """The predicted class ids: ``predictions`` as they are when they have the labels' shape (ids already), else
    the argmax over their last axis (logits; a tuple's first item)."""
    if isinstance(predictions, (tuple, list)):
        predictions = predictions[0]
    predictions = np.asarray(predictions)
    return predictions if predictions.shape == np.shape(label_ids) else np.argmax(predictions, axis=-1)


class ClassificationMetrics:
    """``Trainer(compute_metrics=...)`` reporting the chosen ``names`` of :data:`CLASSIFICATION_METRICS`."""

    def __init__(self, names: Sequence[str], num_classes: int | None = None):
        unknown = [n for n in names if n not in CLASSIFICATION_METRICS]
        if unknown or not names:
            raise ValueError(f"metrics: {unknown or 'none'} not a classification metric; choose from "
                             f"{', '.join(CLASSIFICATION_METRICS)}.")
        self.names = tuple(names)
        self.num_classes = num_classes

    def __call__(self, eval_prediction) -> dict[str, float]:
        from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef, precision_score, recall_score

        labels = np.asarray(eval_prediction.label_ids).reshape(-1)
        predictions = predicted_ids(eval_prediction.predictions, eval_prediction.label_ids).reshape(-1)
        scored = labels != IGNORE_INDEX
        labels, predictions = labels[scored], predictions[scored]
        averaged = {"f1": f1_score, "precision": precision_score, "recall": recall_score}
        out: dict[str, float] = {}
        for name in self.names:
            if name == "accuracy":
                out["accuracy"] = float(accuracy_score(labels, predictions))
            elif name == "matthews":
                out["matthews"] = float(matthews_corrcoef(labels, predictions))
            else:
                for average in _averages(self.num_classes):
                    extra = {"labels": [0, 1]} if average == "binary" else {}  # class 1 is the positive one
                    out[_key(name, average)] = float(averaged[name](labels, predictions, average=average,
                                                                    zero_division=0, **extra))
        return out
