"""Accuracy, in one place: the trainer's default ``compute_metrics`` and the diagnostics' per-client view.

>>> trainer = FederatedTrainer(model, args, train, test)          # compute_metrics=accuracy_metrics
>>> per_client_accuracy(correct, partition.client_indices)         # FedGH's Acc_l (mean, std over clients)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["accuracy_metrics", "correct_predictions", "evaluate_model", "logits_of", "per_client_accuracy"]

#: timing entries of ``Trainer.evaluate`` that are not metrics of the model
_TIMINGS = ("_runtime", "_samples_per_second", "_steps_per_second", "_model_preparation_time")


def logits_of(predictions: Any) -> np.ndarray:
    """The logits among a Trainer's predictions (a model returning several outputs gives a tuple; the
    logits come first)."""
    return predictions[0] if isinstance(predictions, tuple) else predictions


def correct_predictions(prediction) -> np.ndarray:
    """Per sample, whether the top-1 class of an ``EvalPrediction``/``PredictionOutput`` is the label."""
    return np.argmax(logits_of(prediction.predictions), axis=-1) == prediction.label_ids


def accuracy_metrics(eval_prediction) -> dict[str, float]:
    """``Trainer(compute_metrics=...)``: top-1 accuracy of the logits (the Trainer prefixes ``eval_``)."""
    return {"accuracy": float(correct_predictions(eval_prediction).mean())}


def per_client_accuracy(correct: np.ndarray, client_indices: Sequence[Sequence[int]]) -> dict[str, float]:
    """Mean and std over clients (with data) of their accuracy, from per-sample ``correct`` of the whole
    training set; plus the accuracy over all of it."""
    per_client = [float(correct[np.asarray(rows)].mean()) for rows in client_indices if len(rows)]
    return {"client_accuracy_mean": float(np.mean(per_client)), "client_accuracy_std": float(np.std(per_client)),
            "train_accuracy_all": float(correct.mean())}


def evaluate_model(client_trainer, dataset) -> dict[str, float]:
    """``eval_*`` metrics of the weights the local Trainer holds, on ``dataset`` (timings left out)."""
    metrics = client_trainer.evaluate(eval_dataset=dataset, metric_key_prefix="eval")
    return {k: float(v) for k, v in metrics.items() if k.startswith("eval_") and not k.endswith(_TIMINGS)}
