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


def _built(kind, tmp_path):
    from transformers import AutoModelForSequenceClassification

    from hf_fedflat.data.tiny_text import write_tiny_model
    from hf_fedflat.models import create_model

    if kind == "bert":
        return AutoModelForSequenceClassification.from_pretrained(write_tiny_model(tmp_path / "bert", "bert"))
    if kind == "bert+lora":
        from peft import LoraConfig, get_peft_model

        bert = _built("bert", tmp_path)
        return get_peft_model(bert, LoraConfig(task_type="SEQ_CLS", r=2, target_modules=["query", "value"]))
    if kind == "timm backbone":
        return create_model("resnet10t", num_classes=3, in_chans=3, image_size=32)
    if kind == "small_cnn":
        return create_model("small_cnn", num_classes=3, in_chans=1, image_size=8)
    from conftest import TinyClassifier

    return TinyClassifier()


@pytest.mark.parametrize("kind,expected", [("bert", (True, False)), ("bert+lora", (True, True)),
                                           ("timm backbone", (True, False)), ("small_cnn", (False, False)),
                                           ("plain module", (False, False))])
def test_a_model_built_in_python_is_judged_like_its_name(kind, expected, tmp_path):
    from hf_fedflat.models.arguments import model_follows_trainer_conventions

    assert model_follows_trainer_conventions(_built(kind, tmp_path)) == expected
