"""--metrics: names read and refused, checked against the task, and the Trainer functions each task gets."""

from __future__ import annotations

import numpy as np
import pytest
from transformers import EvalPrediction

from hf_fedflat.field_checks import ConfigError
from hf_fedflat.metrics.classification import ClassificationMetrics
from hf_fedflat.metrics.language_modeling import causal_lm_metrics, token_statistics
from hf_fedflat.metrics.selection import (
    SelectedKeys,
    check_metrics,
    metric_family,
    metric_keys,
    parse_metrics,
    trainer_metrics,
)
from hf_fedflat.metrics.sequence_labeling import SequenceLabelingMetrics, predicted_tags


def test_parse_metrics_reads_a_comma_separated_list_and_refuses_unknown_names():
    assert parse_metrics(None) is None
    assert parse_metrics(" f1, accuracy ,f1") == ("f1", "accuracy")
    assert parse_metrics(["perplexity"]) == ("perplexity",)
    with pytest.raises(ConfigError, match=r"^metrics: unknown 'f2', 'bleu'; choose from classification: accuracy"):
        parse_metrics("f1,f2,bleu")
    with pytest.raises(ConfigError, match="^metrics: no metric named"):
        parse_metrics(" , ")


def test_check_metrics_refuses_what_the_task_does_not_have():
    check_metrics(("accuracy", "matthews"), "image-classification")
    check_metrics(("perplexity",), None)  # task not known yet: checked later
    with pytest.raises(ConfigError, match=r"^metrics: 'perplexity' does not apply to text-classification \(its "):
        check_metrics(("accuracy", "perplexity"), "text-classification")
    with pytest.raises(ConfigError, match="^metrics: 'matthews', 'token_loss' do not apply to token-classification"):
        check_metrics(("matthews", "token_loss"), "token-classification")
    assert metric_family("image-classification") == metric_family("classification") == "classification"


def test_metric_keys_name_what_the_history_holds():
    assert metric_keys(None, "text-classification") == ["accuracy"]
    assert metric_keys(("f1", "recall"), "image-classification") == ["f1_macro", "f1_micro", "recall_macro",
                                                                        "recall_micro"]
    assert metric_keys(None, "token-classification") == ["f1", "precision", "recall", "accuracy"]
    assert metric_keys(("perplexity",), "causal-lm") == ["perplexity", "tokens"]


def test_trainer_metrics_per_task():
    assert trainer_metrics("image-classification", None) == {}  # the trainer's default accuracy
    chosen = trainer_metrics("text-classification", ("f1",))["compute_metrics"]
    assert isinstance(chosen, ClassificationMetrics) and chosen.names == ("f1",)
    ner = trainer_metrics("token-classification", None, label_names=["O", "B-PER"])
    assert isinstance(ner["compute_metrics"], SequenceLabelingMetrics)
    assert ner["preprocess_logits_for_metrics"] is predicted_tags
    with pytest.raises(ConfigError, match="^label_column: "):
        trainer_metrics("token-classification", None)
    own = object()  # a dataset's own reduction (Reddit's word model) is kept
    lm = trainer_metrics("causal-lm", ("perplexity",), compute_metrics=causal_lm_metrics,
                         preprocess_logits_for_metrics=own)
    assert isinstance(lm["compute_metrics"], SelectedKeys) and lm["preprocess_logits_for_metrics"] is own
    assert trainer_metrics("causal-lm", None)["compute_metrics"] is causal_lm_metrics
    assert trainer_metrics("causal-lm", None)["preprocess_logits_for_metrics"] is token_statistics


def test_selected_causal_lm_keys_by_hand():
    # two rows: summed NLL 2.0 over 4 tokens (3 hits), 1.0 over 1 token (0 hits)
    stats = np.array([[2.0, 4.0, 3.0], [1.0, 1.0, 0.0]])
    compute = trainer_metrics("causal-lm", ("perplexity", "token_accuracy"))["compute_metrics"]
    got = compute(EvalPrediction(predictions=stats, label_ids=np.zeros(2)))
    assert got == {"perplexity": pytest.approx(np.exp(3.0 / 5)), "token_accuracy": pytest.approx(3 / 5),
                   "tokens": 5.0}
