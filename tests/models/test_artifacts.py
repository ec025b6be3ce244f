"""The final model folder as a standard artifact (``hf_fedflat.models.artifacts``): what ``from_pretrained``,
``pipeline``, peft's Auto classes and ``timm`` need, loaded in a process without hf_fedflat, and the model card's
loading snippet run as written.

Offline: tiny random-init models and word-level tokenizers built in the test (``tests/helpers/hf_fixtures.py``).
The end-to-end runs go through ``build_experiment`` with small labelled text datasets registered here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import datasets
import numpy as np
import pytest
import torch

from hf_fedflat import FedTrainingArguments
from hf_fedflat.data.arguments import DataArguments
from hf_fedflat.data.catalog import DATASETS, FederatedData
from hf_fedflat.cli.experiment import build_experiment
from hf_fedflat.models.arguments import ModelArguments
from hf_fedflat.models.auto import load_processing_class
from hf_fedflat.models.lora import LoraArguments

from helpers.hf_fixtures import CORPUS, tiny_bert_dir, tiny_llama_dir, train_word_tokenizer

LABELS = ["positive", "negative"]
# A process where `import hf_fedflat` fails: what a user without the package sees.
NO_FEDFLAT = "import sys; sys.modules['hf_fedflat'] = None\n"


def run_python(code: str, cwd=None) -> str:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=cwd, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {"bert": tiny_bert_dir(root / "bert"), "llama": tiny_llama_dir(root / "llama")}


# ------------------------------------------------------------------------------------------------
# end to end: build_experiment -> final_model/ -> Auto classes, pipeline, card snippet
# ------------------------------------------------------------------------------------------------
def _sentiment_loader(data_args, model_args, seed):
    from transformers import DataCollatorWithPadding

    tokenizer = load_processing_class(model_args, "text-classification")
    rows = [(text, i % 2) for i, text in enumerate(CORPUS)] * 6
    features = datasets.Features({"text": datasets.Value("string"), "label": datasets.ClassLabel(names=LABELS)})
    raw = datasets.Dataset.from_dict({"text": [r[0] for r in rows], "label": [r[1] for r in rows]}, features=features)
    tokenized = raw.map(lambda b: tokenizer(b["text"], truncation=True), batched=True, remove_columns=["text"])
    return FederatedData(name="tiny_sentiment", train=tokenized, eval=tokenized.select(range(16)), num_classes=2,
                         in_chans=0, task="text-classification", hub_id="someone/tiny-sentiment",
                         label_names=raw.features["label"].names, processing_class=tokenizer,
                         data_collator=DataCollatorWithPadding(tokenizer))


DATASETS.setdefault("tiny_sentiment_for_tests", _sentiment_loader)


def _run(tmp_path, model_dir, lora, **extra):
    args = FedTrainingArguments(output_dir=str(tmp_path / "run"), num_clients=2, num_rounds=2, local_steps=3,
                                fed_algorithm="fedavg", per_device_train_batch_size=8, learning_rate=0.05,
                                optim="adamw_torch", optim_args=None, partition_scheme="iid", use_cpu=True,
                                seed=1, **extra)
    experiment = build_experiment(DataArguments("tiny_sentiment_for_tests"),
                                  ModelArguments(model_name_or_path=model_dir, license="apache-2.0"), args,
                                  lora_args=lora)
    output = experiment.trainer.train()
    return experiment, output


@pytest.mark.parametrize("lora_save", [None, "merged", "adapter"])
def test_text_classifier_final_model_is_a_standard_artifact(tmp_path, models, lora_save):
    lora = LoraArguments(use_lora=lora_save is not None, lora_save=lora_save or "merged", lora_r=4)
    experiment, output = _run(tmp_path, models["bert"], lora)
    final = output.final_model_dir
    last = output.history[-1]
    files = set(os.listdir(final))
    assert {"tokenizer.json", "tokenizer_config.json", "README.md"} <= files
    # the saved tokenizer is the one trained in the fixture, not a default one
    from transformers import AutoTokenizer

    saved = AutoTokenizer.from_pretrained(final)
    trained = train_word_tokenizer("bert")
    assert saved.get_vocab() == trained.get_vocab() and len(saved) == len(trained)
    assert saved("a great movie")["input_ids"] == trained("a great movie")["input_ids"]

    card = (tmp_path / "run" / "final_model" / "README.md").read_text()
    meta = card.split("---")[1]
    assert "pipeline_tag: text-classification" in meta and "license: apache-2.0" in meta
    assert "someone/tiny-sentiment" in meta  # datasets
    assert "`adamw_torch`" in card and "betas (0.9, 0.999)" in card

    # the card's loading snippet, run as written against this folder in a process without hf_fedflat; it prints
    # the pipeline's answer: the eval set's accuracy through the pipeline must equal the run's eval_accuracy
    snippet = card.split("## How to load")[1].split("```python")[1].split("```")[0].replace("path/to/this/folder", final)
    eval_set = experiment.data.eval
    texts = [experiment.data.processing_class.decode(ids, skip_special_tokens=True) for ids in eval_set["input_ids"]]
    check = textwrap.dedent(f"""
        import json
        texts, labels = {json.dumps(texts)}, {json.dumps(list(eval_set["label"]))}
        predictions = classifier(texts)
        names = {json.dumps(LABELS)}
        print("ACCURACY", sum(names.index(p["label"]) == y for p, y in zip(predictions, labels)) / len(labels))
    """)
    if lora_save == "merged":  # the same code as the full model's: run in this process (a subprocess costs ~20 s)
        import contextlib
        import io

        with contextlib.redirect_stdout(io.StringIO()) as buffer:
            exec(snippet + check, {})
        out = buffer.getvalue()
    else:
        out = run_python(NO_FEDFLAT + snippet + check)
    accuracy = float(out.split("ACCURACY")[1])
    assert accuracy == pytest.approx(last["eval_accuracy"], abs=1e-9)

    if lora_save == "adapter":
        assert "adapter_config.json" in files and "PeftModel.from_pretrained(base" in card
        return
    # reloads with the Auto class: named labels, and the run's eval loss reproduced
    from transformers import AutoModelForSequenceClassification, DataCollatorWithPadding

    model = AutoModelForSequenceClassification.from_pretrained(final).eval()
    assert model.config.id2label == {0: "positive", 1: "negative"}
    batch = DataCollatorWithPadding(saved)([{k: v for k, v in row.items() if k != "label"} for row in eval_set])
    with torch.no_grad():
        logits = model(**batch).logits
    loss = torch.nn.functional.cross_entropy(logits, torch.tensor(eval_set["label"]))
    assert loss.item() == pytest.approx(last["eval_loss"], rel=1e-4)


def test_causal_lm_lora_adapter_loads_with_peft_auto_class(tmp_path, models):
    from transformers import DataCollatorForLanguageModeling

    def loader(data_args, model_args, seed):
        tokenizer = load_processing_class(model_args, "causal-lm")
        ds = datasets.Dataset.from_dict({"text": CORPUS * 4})
        ds = ds.map(lambda b: tokenizer(b["text"]), batched=True, remove_columns=["text"])
        return FederatedData(name="tiny_lm", train=ds, eval=None, num_classes=1, in_chans=0, task="causal-lm",
                             processing_class=tokenizer,
                             data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False))

    DATASETS.setdefault("tiny_lm_for_tests", loader)
    args = FedTrainingArguments(output_dir=str(tmp_path / "run"), num_clients=2, num_rounds=2, local_steps=2,
                                fed_algorithm="fedavg", per_device_train_batch_size=4, learning_rate=0.01,
                                optim="adamw_torch", partition_scheme="iid", use_cpu=True)
    experiment = build_experiment(DataArguments("tiny_lm_for_tests"), ModelArguments(model_name_or_path=models["llama"]),
                                  args, lora_args=LoraArguments(use_lora=True, lora_save="adapter"))
    assert type(experiment.model).__name__ == "PeftModelForCausalLM"
    # adapters only on the wire: the federated vector is the LoRA matrices
    assert all("lora_" in name for name in experiment.trainer.space.names)
    output = experiment.trainer.train()
    final = output.final_model_dir
    card = (tmp_path / "run" / "final_model" / "README.md").read_text()
    assert "pipeline_tag: text-generation" in card.split("---")[1]
    snippet = card.split("## How to load")[1].split("```python")[1].split("```")[0].replace("path/to/this/folder", final)
    assert "AutoPeftModelForCausalLM" in snippet
    # the adapter on its base reproduces the trained model's logits
    ids = experiment.data.processing_class("a good story", return_tensors="pt")["input_ids"]
    experiment.model.eval()
    with torch.no_grad():
        expected = experiment.model(input_ids=ids).logits[0, -1].tolist()
    out = run_python(NO_FEDFLAT + snippet + f"\nimport torch\nprint('LOGITS', model(input_ids=torch.tensor({ids.tolist()})).logits[0, -1].tolist())")
    got = json.loads(out.split("LOGITS")[1])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------------
# timm: final_model/ in timm's layout, loaded without hf_fedflat
# ------------------------------------------------------------------------------------------------
def test_timm_final_model_loads_without_hf_fedflat(tmp_path):
    args = FedTrainingArguments(output_dir=str(tmp_path / "run"), num_clients=2, num_rounds=1, local_steps=1,
                                fed_algorithm="fedavg", per_device_train_batch_size=16, learning_rate=0.01,
                                partition_scheme="iid", use_cpu=True)
    model_args = ModelArguments("vit_tiny_patch16_224", image_size=16,
                                model_kwargs='{"patch_size": 8, "depth": 1, "embed_dim": 32, "num_heads": 2}')
    experiment = build_experiment(DataArguments("digits"), model_args, args)
    output = experiment.trainer.train()
    final = output.final_model_dir
    config = json.loads(open(os.path.join(final, "config.json")).read())
    assert config["architecture"] == "vit_tiny_patch16_224" and config["num_classes"] == 10
    assert "num_classes" not in config["model_args"] and config["model_args"]["in_chans"] == 1
    assert config["pretrained_cfg"]["mean"] == pytest.approx([experiment.data.mean[0]])
    x = torch.randn(2, 1, 16, 16, generator=torch.Generator().manual_seed(0))
    from hf_fedflat.models import load_model

    with torch.no_grad():  # hf_fedflat reads its own files from final_model/hf_fedflat/
        expected = load_model(final)(pixel_values=x).logits
    code = NO_FEDFLAT + textwrap.dedent(f"""
        import torch, timm
        from transformers import AutoModelForImageClassification
        x = torch.tensor({x.tolist()})
        by_timm = timm.create_model("local-dir:{final}", pretrained=True).eval()
        by_auto = AutoModelForImageClassification.from_pretrained("{final}").eval()
        with torch.no_grad():
            print("TIMM", by_timm(x).tolist())
            print("AUTO", by_auto(pixel_values=x).logits.tolist())
        print("CLASS", type(by_auto).__name__)
    """)
    # the card's snippet, as written, loads the same model (the transformers part: the rest needs hf_fedflat)
    card = open(os.path.join(final, "README.md")).read()
    snippet = card.split("## How to load")[1].split("```python")[1].split("```")[0]
    snippet = snippet.split("# hf_fedflat")[0].replace("path/to/this/folder", final)
    assert "TimmWrapper" in snippet and "local-dir:" in snippet
    code += snippet + "\nwith torch.no_grad():\n    print('SNIPPET', model(pixel_values=x).logits.tolist())\n"
    out = run_python(code)
    torch.testing.assert_close(torch.tensor(json.loads(out.split("SNIPPET")[1].split("\n")[0])), expected,
                               rtol=1e-5, atol=1e-6)
    by_timm = torch.tensor(json.loads(out.split("TIMM")[1].split("\n")[0]))
    by_auto = torch.tensor(json.loads(out.split("AUTO")[1].split("\n")[0]))
    assert "CLASS TimmWrapperForImageClassification" in out
    torch.testing.assert_close(by_timm, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(by_auto, expected, rtol=1e-5, atol=1e-6)


def test_adapters_load_from_any_working_directory_without_hf_fedflat(tmp_path, models, monkeypatch):
    """A model given by a relative path: the adapter records its absolute path, and peft's Auto classes load it in a
    process without hf_fedflat, started elsewhere; the trained labels come from the folder's config.json."""
    monkeypatch.chdir(os.path.dirname(models["bert"]))
    relative = os.path.basename(models["bert"])
    lora = LoraArguments(use_lora=True, lora_save="adapter", lora_r=4)
    args = FedTrainingArguments(output_dir=str(tmp_path / "run"), num_clients=2, num_rounds=1, local_steps=2,
                                fed_algorithm="fedavg", per_device_train_batch_size=8, learning_rate=0.05,
                                optim="adamw_torch", partition_scheme="iid", use_cpu=True, seed=1)
    experiment = build_experiment(DataArguments("tiny_sentiment_for_tests"), ModelArguments(model_name_or_path=relative),
                                  args, lora_args=lora)
    final = experiment.trainer.train().final_model_dir
    adapter = json.loads(open(os.path.join(final, "adapter_config.json")).read())
    assert adapter["base_model_name_or_path"] == models["bert"]  # absolute, not "bert"
    ids = experiment.data.processing_class("a great movie", return_tensors="pt")["input_ids"]
    experiment.model.eval()
    with torch.no_grad():
        expected = experiment.model(input_ids=ids).logits[0].tolist()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = run_python(NO_FEDFLAT + textwrap.dedent(f"""
        import json, sys, torch
        from peft import AutoPeftModelForSequenceClassification
        from transformers import AutoConfig
        model = AutoPeftModelForSequenceClassification.from_pretrained({final!r}).eval()
        with torch.no_grad():
            print("LOGITS", json.dumps(model(input_ids=torch.tensor({ids.tolist()})).logits[0].tolist()))
        print("LABELS", json.dumps(AutoConfig.from_pretrained({final!r}).id2label))
        print("FEDFLAT", any(name.startswith("hf_fedflat") and sys.modules[name] for name in sys.modules))
    """), cwd=elsewhere)
    np.testing.assert_allclose(json.loads(out.split("LOGITS")[1].split("\n")[0]), expected, rtol=1e-5, atol=1e-6)
    assert json.loads(out.split("LABELS")[1].split("\n")[0]) == {"0": "positive", "1": "negative"}
    assert "FEDFLAT False" in out
