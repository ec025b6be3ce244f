"""``ModelArguments.follows_trainer_conventions``: which models get AdamW at the Trainer's rate when the optimizer
and the learning rate are left unset."""

from __future__ import annotations

import pytest

from hf_fedflat.models.arguments import ModelArguments


@pytest.mark.parametrize("name", ["small_cnn", "fedgam_cnn", "resnet18_gn", "logistic", "char_lstm", "char_transformer",
                                  "word_lstm"])
def test_built_in_models_keep_the_papers_optimizer(name):
    assert ModelArguments(model_name=name).follows_trainer_conventions is False


@pytest.mark.parametrize("arguments", [{"model_name": "vit_tiny_patch16_224"}, {"model_name": "resnet18"},
                                       {"model_name_or_path": "some/folder"},
                                       {"model_name": "small_cnn", "model_name_or_path": "distilbert-base-uncased"}])
def test_transformers_and_timm_models_follow_the_trainer(arguments):
    assert ModelArguments(**arguments).follows_trainer_conventions is True
