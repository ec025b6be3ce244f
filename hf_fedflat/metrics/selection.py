"""Which metrics a run reports (``--metrics``), checked against its task, and the Trainer functions computing them.

========================  ===============================================  ==========================================
task                      ``--metrics`` names                              default (``--metrics`` unset)
========================  ===============================================  ==========================================
image/text classification ``accuracy``, ``f1``, ``precision``, ``recall``,  ``accuracy``
                          ``matthews`` (:mod:`.classification`)
token classification      ``f1``, ``precision``, ``recall``, ``accuracy``  all four
                          (entity level, :mod:`.sequence_labeling`)
causal LM                 ``perplexity``, ``token_loss``,                  all three
                          ``token_accuracy`` (:mod:`.language_modeling`)
========================  ===============================================  ==========================================

An unknown name is refused when the arguments are read; a name the run's task does not have (``perplexity`` for a
classifier) as soon as the task is known, before the data loads when ``--task`` or the model's ``config.json``
says it (:func:`check_metrics`). Every key reaches ``history.json`` and ``report_to`` as ``eval_<key>``
(:func:`metric_keys`). The functions keep the Trainer's contract, ``EvalPrediction`` in, ``dict[str, float]``
out, so whatever evaluates the global model (the local Trainer's ``evaluate``) calls them the same way.

>>> names = parse_metrics("accuracy,f1")                  # ("accuracy", "f1"), or ConfigError naming metrics
>>> check_metrics(names, "text-classification")
>>> trainer_metrics("text-classification", names)          # {"compute_metrics": ClassificationMetrics(...)}
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..field_checks import ConfigError
from .classification import CLASSIFICATION_METRICS, ClassificationMetrics, classification_keys
from .sequence_labeling import SEQUENCE_LABELING_METRICS, SequenceLabelingMetrics, predicted_tags

__all__ = ["CAUSAL_LM_METRICS", "KNOWN_METRICS", "METRICS_BY_TASK", "SelectedKeys", "check_metrics", "metric_family",
           "metric_keys", "parse_metrics", "trainer_metrics"]

CAUSAL_LM_METRICS = ("perplexity", "token_loss", "token_accuracy")

METRICS_BY_TASK: dict[str, tuple[str, ...]] = {
    "classification": CLASSIFICATION_METRICS,
    "token-classification": SEQUENCE_LABELING_METRICS,
    "causal-lm": CAUSAL_LM_METRICS,
}
"""Metric family -> the names ``--metrics`` may take for it."""

KNOWN_METRICS = tuple(sorted({name for names in METRICS_BY_TASK.values() for name in names}))


def metric_family(task: str | None) -> str:
    """``token-classification`` and ``causal-lm`` as they are; every other task (image, text) is ``classification``."""
    return task if task in ("token-classification", "causal-lm") else "classification"


def parse_metrics(value: str | Sequence[str] | None) -> tuple[str, ...] | None:
    """``"accuracy, f1"`` -> ``("accuracy", "f1")`` (repeats dropped); None for unset.

    Raises:
        ConfigError: an empty list, or a name no task has (the message lists every known name).
    """
    if value is None:
        return None
    parts = value.split(",") if isinstance(value, str) else [str(v) for v in value]
    names = tuple(dict.fromkeys(p.strip() for p in parts if p.strip()))
    if not names:
        raise ConfigError(f"metrics: no metric named in {value!r}; give a comma-separated list such as accuracy,f1, "
                          "or leave it unset for the task's default.")
    unknown = [n for n in names if n not in KNOWN_METRICS]
    if unknown:
        raise ConfigError(f"metrics: unknown {', '.join(map(repr, unknown))}; choose from "
                          + "; ".join(f"{family}: {', '.join(names)}" for family, names in METRICS_BY_TASK.items())
                          + ".")
    return names


def check_metrics(names: Sequence[str] | None, task: str | None) -> None:
    """Refuse the names the task has not (nothing to check for ``names`` None or an unknown ``task``)."""
    if not names or task is None:
        return
    family = metric_family(task)
    wrong = [n for n in names if n not in METRICS_BY_TASK[family]]
    if wrong:
        raise ConfigError(f"metrics: {', '.join(map(repr, wrong))} {'does' if len(wrong) == 1 else 'do'} not apply to "
                          f"{task} (its metrics: {', '.join(METRICS_BY_TASK[family])}).")


def metric_keys(names: Sequence[str] | None, task: str | None) -> list[str]:
    """The keys the run's evaluation reports (``history.json`` and ``report_to`` prefix them with ``eval_``),
    ``names`` None giving the task's default ones; the Trainer's own ``loss`` is not listed."""
    family = metric_family(task)
    if family == "classification":
        return classification_keys(names or ("accuracy",))
    if family == "token-classification":
        return list(names or SEQUENCE_LABELING_METRICS)
    return [*(names or CAUSAL_LM_METRICS), "tokens"]


class SelectedKeys:
    """A ``compute_metrics`` reporting only ``keys`` of what ``compute_metrics`` returns (a causal LM's
    ``--metrics perplexity``: its token statistics are reduced once, the other keys dropped)."""

    def __init__(self, compute_metrics: Callable, keys: Sequence[str]):
        self.compute_metrics = compute_metrics
        self.keys = tuple(keys)

    def __call__(self, eval_prediction) -> dict[str, float]:
        values = self.compute_metrics(eval_prediction)
        return {k: values[k] for k in self.keys if k in values}


def trainer_metrics(task: str | None, names: Sequence[str] | None, *, label_names: Sequence[str] | None = None,
                    compute_metrics: Callable | None = None,
                    preprocess_logits_for_metrics: Callable | None = None) -> dict[str, Any]:
    """``compute_metrics`` and ``preprocess_logits_for_metrics`` for the run's Trainer.

    Args:
        task: the run's task (:data:`hf_fedflat.models.auto.TASKS`; any other value is a classification).
        names: the chosen metrics (:func:`parse_metrics`), or None for the task's default.
        label_names: tag names in label-id order (token classification).
        compute_metrics, preprocess_logits_for_metrics: what the data came with (a causal LM's token statistics,
            the Reddit word model's own), kept unless the chosen metrics need others.

    Returns:
        The keyword arguments to give the trainer; empty when the data's own (or the trainer's default,
        accuracy) already is the choice.
    """
    check_metrics(names, task)
    family = metric_family(task)
    kept = {k: v for k, v in (("compute_metrics", compute_metrics),
                              ("preprocess_logits_for_metrics", preprocess_logits_for_metrics)) if v is not None}
    if family == "classification":
        num_classes = len(label_names) if label_names is not None else None  # two: the binary values too
        return {**kept, "compute_metrics": ClassificationMetrics(names, num_classes)} if names else kept
    if family == "token-classification":
        if label_names is None:
            raise ConfigError("label_column: token classification needs the tag names (B-PER, I-PER, O, ...) to score "
                              "entities; give the tags as strings or as a Sequence(ClassLabel) feature.")
        return {"compute_metrics": SequenceLabelingMetrics(label_names, names or SEQUENCE_LABELING_METRICS),
                "preprocess_logits_for_metrics": preprocess_logits_for_metrics or predicted_tags}
    from .language_modeling import causal_lm_metrics, token_statistics

    base = compute_metrics or causal_lm_metrics
    return {"compute_metrics": SelectedKeys(base, metric_keys(names, task)) if names else base,
            "preprocess_logits_for_metrics": preprocess_logits_for_metrics or token_statistics}
