"""Any transformers model by --model_name_or_path (``hf_fedflat.models.auto``): task -> Auto class, the dataset's
named labels, the LoRA task type.

Offline: tiny random-init models and word-level tokenizers built in the test (``tests/helpers/hf_fixtures.py``).
The final model folder these models leave is tested in ``test_artifacts.py``.
"""

from __future__ import annotations

import pytest
import torch

from hf_fedflat.models.arguments import ModelArguments
from hf_fedflat.models.auto import build_auto_model, load_processing_class, resolve_task
from hf_fedflat.models.lora import LoraArguments, apply_lora

from helpers.hf_fixtures import tiny_bert_dir, tiny_gpt2_dir, tiny_llama_dir, tiny_vit_dir, train_word_tokenizer


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {
        "bert": tiny_bert_dir(root / "bert"),
        "bert_token": tiny_bert_dir(root / "bert_token", num_labels=3, architecture="BertForTokenClassification"),
        "bert_mlm": tiny_bert_dir(root / "bert_mlm", architecture="BertForMaskedLM"),
        "gpt2": tiny_gpt2_dir(root / "gpt2"),
        "llama": tiny_llama_dir(root / "llama"),
        "vit": tiny_vit_dir(root / "vit"),
    }


# ------------------------------------------------------------------------------------------------
# task and loading
# ------------------------------------------------------------------------------------------------
def test_task_from_architectures_then_data_then_error(models):
    assert resolve_task(ModelArguments(model_name_or_path=models["bert"])) == "text-classification"
    assert resolve_task(ModelArguments(model_name_or_path=models["bert_token"])) == "token-classification"
    assert resolve_task(ModelArguments(model_name_or_path=models["gpt2"])) == "causal-lm"
    assert resolve_task(ModelArguments(model_name_or_path=models["llama"])) == "causal-lm"
    assert resolve_task(ModelArguments(model_name_or_path=models["vit"])) == "image-classification"
    # an explicit --task wins over the architectures
    assert resolve_task(ModelArguments(model_name_or_path=models["gpt2"], task="text-classification")) == "text-classification"
    # a masked-LM checkpoint says nothing about the task: the data decides, else the user must
    mlm = ModelArguments(model_name_or_path=models["bert_mlm"])
    assert resolve_task(mlm, "text-classification") == "text-classification"
    with pytest.raises(ValueError, match=r"task: cannot tell the task of .*BertForMaskedLM.*pass --task"):
        resolve_task(mlm)
    with pytest.raises(ValueError, match="task: must be one of image-classification, text-classification"):
        ModelArguments(model_name_or_path=models["bert"], task="summarization")
    with pytest.raises(ValueError, match="task: applies to --model_name_or_path"):
        ModelArguments(task="causal-lm")


@pytest.mark.parametrize("use_lora", [False, True])
@pytest.mark.parametrize("name, auto_class, peft_class", [
    ("bert", "BertForSequenceClassification", "PeftModelForSequenceClassification"),
    ("bert_token", "BertForTokenClassification", "PeftModelForTokenClassification"),
    ("gpt2", "GPT2LMHeadModel", "PeftModelForCausalLM"),
    ("llama", "LlamaForCausalLM", "PeftModelForCausalLM"),
    ("vit", "ViTForImageClassification", "PeftModel"),
])
def test_each_task_loads_with_labels_and_lora(models, name, auto_class, peft_class, use_lora):
    args = ModelArguments(model_name_or_path=models[name])
    task = resolve_task(args)
    processor = load_processing_class(args, task)
    names = None if task == "causal-lm" else ["cat", "dog", "bird", "fish"]
    model = build_auto_model(args, task=task, label_names=names, processing_class=processor)
    assert type(model).__name__ == auto_class
    if names:  # the head has the dataset's classes, named
        assert model.config.num_labels == 4
        assert model.config.id2label == {0: "cat", 1: "dog", 2: "bird", 3: "fish"}
        assert model.config.label2id == {"cat": 0, "dog": 1, "bird": 2, "fish": 3}
    if task == "image-classification":
        assert type(processor).__name__ == "ViTImageProcessor"
        batch = {"pixel_values": torch.randn(2, 3, 16, 16)}
    else:
        assert processor.get_vocab() == train_word_tokenizer("bert" if "bert" in name else "gpt").get_vocab()
        batch = dict(processor(["a good movie", "bad"], padding=True, return_tensors="pt"))
    model = apply_lora(model, LoraArguments(use_lora=use_lora), task=task)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    if use_lora:
        assert type(model).__name__ == peft_class
        heads = [n for n in trainable if "lora_" not in n]
        if task == "causal-lm":  # adapters only on the wire
            assert heads == []
        else:  # adapters + the classifier (peft's modules_to_save)
            assert heads and all(".classifier.modules_to_save." in n for n in heads)
        assert any("lora_A" in n for n in trainable)
    else:
        assert len(trainable) == len(list(model.parameters()))
    out = model(**batch)
    expected = (2, 4) if task in ("image-classification", "text-classification") else None
    if expected:
        assert tuple(out.logits.shape) == expected
