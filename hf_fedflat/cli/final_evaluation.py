"""``--do_eval`` and ``--do_predict``: what they mean in transformers' example scripts, after the last round.

In those scripts ``do_eval`` evaluates the trained model on the evaluation split at the end and ``do_predict``
predicts on the test split, while ``eval_strategy`` drives the evaluations during training. Here the evaluations
during training are ``eval_every_n_rounds``'s (every N rounds and after the last, into ``history.json``), whatever
``do_eval`` says, and the two flags add the scripts' end-of-run outputs for the final global model:

* ``--do_eval``: one more evaluation of the final model on the held-out split, with the Trainer's full metrics
  (``eval_loss``, ``eval_accuracy``, ..., ``eval_runtime``, and ``round``), printed as the Trainer's scripts print
  them and written to ``<output_dir>/eval_results.json``;
* ``--do_predict``: the final model's predictions on the held-out split (a dataset's test split, else the
  ``--test_fraction`` of its training data held out: the rows the rounds are evaluated on), its metrics prefixed
  ``test_`` in ``predict_results.json`` and, for classification tasks, the predicted class of each row (of each
  labelled token, for token classification) in ``predictions.json``.

Both need a held-out split: a run without one is refused before training (:func:`check_final_evaluation`).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..field_checks import ConfigError

__all__ = ["EVAL_RESULTS", "PREDICTIONS", "PREDICT_RESULTS", "check_final_evaluation", "run_final_evaluation"]

EVAL_RESULTS, PREDICT_RESULTS, PREDICTIONS = "eval_results.json", "predict_results.json", "predictions.json"
#: label id the Trainer's collators give the positions that carry no label (padding, sub-word continuations)
IGNORED_LABEL = -100


def check_final_evaluation(args, data) -> None:
    """Refuse ``do_eval`` / ``do_predict`` when ``data`` has no held-out split (``ConfigError`` naming the field)."""
    for name in ("do_eval", "do_predict"):
        if getattr(args, name, False) and data.eval is None:
            raise ConfigError(f"{name}: the {data.name} data has no held-out split to "
                              f"{'evaluate' if name == 'do_eval' else 'predict'} on; give a dataset with a test "
                              f"split (or --eval_split), or leave {name} unset.")


def _predicted_classes(predictions: Any, label_ids: Any, task: str) -> list | None:
    """The predicted class ids of a classification task (per labelled token for token classification);
    None for other tasks (a causal LM's predictions are not classes)."""
    logits = predictions[0] if isinstance(predictions, tuple) else predictions
    logits = np.asarray(logits)
    if task in ("image-classification", "text-classification") and logits.ndim == 2:
        return logits.argmax(-1).tolist()
    if task == "token-classification" and logits.ndim in (2, 3) and label_ids is not None:
        labels = np.asarray(label_ids)
        # ndim 2: already the tag ids (the task's preprocess_logits_for_metrics reduces each batch to its argmax)
        predicted = logits.argmax(-1) if logits.ndim == 3 else logits
        return [row[mask].tolist() for row, mask in zip(predicted, labels != IGNORED_LABEL)]
    return None


def _label_ids(label_ids: Any, task: str) -> list | None:
    if label_ids is None:
        return None
    labels = np.asarray(label_ids)
    if task == "token-classification" and labels.ndim == 2:
        return [row[row != IGNORED_LABEL].tolist() for row in labels]
    return labels.tolist()


def run_final_evaluation(trainer, data, args) -> dict[str, dict]:
    """Main process, after training: ``do_eval``'s and ``do_predict``'s outputs for the model the trainer holds
    (the final global model); returns ``{"eval": metrics, "predict": metrics}`` for those that ran."""
    from ..io import atomic_write_json

    results: dict[str, dict] = {}
    if not trainer.comm.is_main:
        return results
    output_dir = args.output_dir
    if args.do_eval:
        metrics = trainer.evaluate(data.eval)
        trainer.log_metrics("eval", metrics)
        atomic_write_json(metrics, os.path.join(output_dir, EVAL_RESULTS), root=output_dir)
        results["eval"] = metrics
    if args.do_predict:
        prediction = trainer.predict(data.eval)
        metrics = dict(prediction.metrics)
        trainer.log_metrics("predict", metrics)
        atomic_write_json(metrics, os.path.join(output_dir, PREDICT_RESULTS), root=output_dir)
        task = getattr(data, "task", "")
        classes = _predicted_classes(prediction.predictions, prediction.label_ids, task)
        if classes is not None:
            atomic_write_json({"task": task, "label_names": getattr(data, "label_names", None),
                               "predictions": classes, "label_ids": _label_ids(prediction.label_ids, task)},
                              os.path.join(output_dir, PREDICTIONS), root=output_dir, indent=None)
        results["predict"] = metrics
    return results
