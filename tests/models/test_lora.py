"""Tests of LoRA through peft: trainable set, save/load in both forms, errors, and a federated round."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import datasets
import numpy as np
import pytest
import yaml
import torch
from peft import PeftModel
from safetensors.torch import load_file, save_file
from transformers import HfArgumentParser

from hf_fedflat import FederatedCallback, FedTrainingArguments, FederatedTrainer, ParameterSpace
from hf_fedflat.models import (
    LoraArguments,
    apply_lora,
    classification_head_names,
    create_model,
    load_model,
    save_federated_model,
    total_parameter_bytes,
    trainable_parameter_bytes,
)
from hf_fedflat.models.lora import DEFAULT_LORA_TARGET_MODULES, frozen_parameter_digest, quiet_peft

NUM_CLASSES = 5
# The ViT-B/32 family, shrunk by timm kwargs so that nothing is downloaded and a step takes milliseconds.
VIT = "vit_base_patch32_224"
TINY_VIT = dict(in_chans=1, image_size=16, patch_size=8, depth=2, embed_dim=32, num_heads=2)
TINY_TRANSFORMER = dict(vocab_size=11, d_model=16, num_layers=2, num_heads=2, max_length=12)
LORA = LoraArguments(use_lora=True, lora_r=4, lora_alpha=8)


def _vit(seed=0):
    torch.manual_seed(seed)
    return create_model(VIT, NUM_CLASSES, **TINY_VIT)


def _char_transformer(seed=0):
    torch.manual_seed(seed)
    return create_model("char_transformer", **TINY_TRANSFORMER)


def _inputs(kind, n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    if kind == "vit":
        return {"pixel_values": torch.randn(n, 1, 16, 16, generator=g)}
    return {"input_ids": torch.randint(0, 11, (n, 12), generator=g)}


BUILDERS = {"vit": _vit, "char_transformer": _char_transformer}


def _lora(kind, seed=0, args=LORA):
    base = BUILDERS[kind](seed)
    torch.manual_seed(seed + 100)
    return apply_lora(base, args)


def _sgd_step(model, kind, lr=0.5):
    """One plain SGD step on the trainable parameters (moves lora_B off zero and the head)."""
    inputs = _inputs(kind, seed=1)
    labels = torch.arange(4) % NUM_CLASSES
    out = model(**inputs, labels=labels)
    out.loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p -= lr * p.grad
                p.grad = None


# ------------------------------------------------------------------------------------------------
# arguments
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "field,value",
    [("lora_r", 0), ("lora_r", 2.5), ("lora_alpha", 0), ("lora_dropout", 1.0), ("lora_dropout", -0.1),
     ("lora_target_modules", ""), ("lora_target_modules", "blocks.(qkv"), ("lora_modules_to_save", [""]),
     ("lora_save", "full")],
)
def test_bad_arguments_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"^{field}"):
        LoraArguments(**{field: value})


def test_arguments_parse_from_the_command_line():
    (args,) = HfArgumentParser(LoraArguments).parse_args_into_dataclasses(
        ["--use_lora", "--lora_r", "16", "--lora_target_modules", "qkv, fc1", "--lora_modules_to_save", "head",
         "--lora_save", "adapter"]
    )
    assert args.use_lora and args.lora_r == 16 and args.lora_save == "adapter"
    assert args.target_modules() == ["qkv", "fc1"] and args.lora_modules_to_save == ["head"]
    (default,) = HfArgumentParser(LoraArguments).parse_args_into_dataclasses([])
    assert not default.use_lora and default.lora_modules_to_save is None
    assert default.target_modules() == DEFAULT_LORA_TARGET_MODULES  # a regex stays a string
    assert LoraArguments(lora_target_modules="all-linear").target_modules() == "all-linear"


def test_default_regex_matches_block_linears_only():
    names = [n for n, _ in _vit().named_modules()]
    matched = [n for n in names if re.fullmatch(DEFAULT_LORA_TARGET_MODULES, n)]
    expected = [f"backbone.blocks.{i}.{part}" for i in range(2)
                for part in ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")]
    assert matched == expected
    assert "backbone.patch_embed.proj" in names and "backbone.patch_embed.proj" not in matched
    # the same default fits the character transformer
    names = [n for n, _ in _char_transformer().named_modules()]
    assert [n for n in names if re.fullmatch(DEFAULT_LORA_TARGET_MODULES, n)] == [
        f"blocks.{i}.{part}" for i in range(2) for part in ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")]


# ------------------------------------------------------------------------------------------------
# wrapping
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["vit", "char_transformer"])
def test_only_adapters_and_head_are_trainable(kind):
    model = _lora(kind)
    assert isinstance(model, PeftModel)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n or ".head.modules_to_save." in n for n in trainable)
    assert sum(".head.modules_to_save." in n for n in trainable) == 2  # weight and bias
    # r * (in + out) per adapted linear, 4 linears per block, 2 blocks; plus the full head
    d = 32 if kind == "vit" else 16
    per_block = sum(4 * (i + o) for i, o in ((d, 3 * d), (d, d), (d, 4 * d), (4 * d, d)))
    num_classes = NUM_CLASSES if kind == "vit" else 11
    expected = 2 * per_block + d * num_classes + num_classes
    assert trainable_parameter_bytes(model) == 4 * expected
    assert ParameterSpace(model).numel == expected
    if kind == "vit":  # the patch embedding keeps its plain convolution
        assert type(model.get_base_model().backbone.patch_embed.proj) is torch.nn.Conv2d


def test_vit_b32_lora_r8_sends_under_two_percent_of_the_model():
    """Real ViT-B/32 sizes on the meta device: exact counts, no memory, no download."""
    with torch.device("meta"):
        base = create_model(VIT, 65, image_size=224)
        full = total_parameter_bytes(base)
        model = apply_lora(base, LoraArguments(use_lora=True, lora_r=8))
    d, hidden, depth = 768, 3072, 12
    lora = depth * 8 * ((d + 3 * d) + (d + d) + (d + hidden) + (hidden + d))
    head = d * 65 + 65
    assert trainable_parameter_bytes(model) == 4 * (lora + head) == 4 * 1_229_633
    assert full == 4 * 87_505_217
    assert trainable_parameter_bytes(model) / total_parameter_bytes(model) < 0.02


def test_head_detection_for_each_model_family():
    assert classification_head_names(_vit()) == ["backbone.head"]
    assert classification_head_names(_char_transformer()) == ["head"]
    assert classification_head_names(create_model("resnet18_gn", 3)) == ["backbone.fc"]
    assert classification_head_names(create_model("small_cnn", 3)) == ["backbone.fc2"]


def test_targets_matching_nothing_name_the_field():
    with pytest.raises(ValueError, match="^lora_target_modules: 'nothing' matches no module"):
        apply_lora(_vit(), LoraArguments(use_lora=True, lora_target_modules="nothing"))
    # the default targets transformer blocks; the LSTM has none, and the message shows its layers
    with pytest.raises(ValueError, match="^lora_target_modules: .* CharLSTMModel.*lstm"):
        apply_lora(create_model("char_lstm", hidden_size=8), LoraArguments(use_lora=True))
    with pytest.raises(ValueError, match="^lora_modules_to_save: classifier"):
        apply_lora(_vit(), LoraArguments(use_lora=True, lora_modules_to_save=["classifier"]))
    with pytest.raises(ValueError, match="^model: already wrapped"):
        apply_lora(_lora("vit"), LORA)


def test_frozen_digest_identifies_the_base_not_the_adapters():
    model = _lora("vit")
    digest = frozen_parameter_digest(model)
    _sgd_step(model, "vit")  # trains adapters and head only
    assert frozen_parameter_digest(model) == digest == frozen_parameter_digest(_lora("vit"))
    assert frozen_parameter_digest(_lora("vit", seed=1)) != digest


def test_use_lora_false_returns_the_model_untouched():
    model = _vit()
    assert apply_lora(model, LoraArguments()) is model
    assert all(p.requires_grad for p in model.parameters())


# ------------------------------------------------------------------------------------------------
# saving
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["vit", "char_transformer"])
def test_merged_save_loads_as_a_plain_model_with_the_same_logits(kind, tmp_path):
    model = _lora(kind)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    _sgd_step(model, kind)
    assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if not p.requires_grad)
    lora_b = [p for n, p in model.named_parameters() if ".lora_B." in n]
    assert all(p.abs().max() > 0 for p in lora_b)  # the adapters really changed the function

    model.eval()
    inputs = _inputs(kind, seed=2)
    with torch.no_grad():
        expected = model(**inputs).logits
    save_federated_model(model, tmp_path, lora_save="merged")
    assert {"config.json", "model.safetensors"} <= set(os.listdir(tmp_path))
    assert not any("lora" in k or "modules_to_save" in k for k in load_file(tmp_path / "model.safetensors"))
    loaded = load_model(tmp_path)
    assert not isinstance(loaded, PeftModel)
    with torch.no_grad():
        torch.testing.assert_close(loaded(**inputs).logits, expected, rtol=1e-5, atol=1e-5)
        # the merged weights differ from the frozen base: the adapters were folded in
        base = BUILDERS[kind]()
        assert (base.eval()(**inputs).logits - expected).abs().max() > 1e-3
    # saving merged left the live model wrapped and trainable
    assert isinstance(model, PeftModel) and trainable_parameter_bytes(model) > 0
    with torch.no_grad():
        torch.testing.assert_close(model(**inputs).logits, expected, rtol=0, atol=0)


def test_adapter_save_reloads_onto_the_base_model(tmp_path):
    model = _lora("vit")
    _sgd_step(model, "vit")
    model.eval()
    inputs = _inputs("vit", seed=2)
    with torch.no_grad():
        expected = model(**inputs).logits
    save_federated_model(model, tmp_path, lora_save="adapter")
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(os.listdir(tmp_path))
    assert not any(name.endswith(".bin") for name in os.listdir(tmp_path))
    saved = load_file(tmp_path / "adapter_model.safetensors")
    assert sum(t.numel() for t in saved.values()) * 4 == trainable_parameter_bytes(model)  # adapters + head only
    assert json.loads((tmp_path / "adapter_config.json").read_text())["modules_to_save"] == ["backbone.head"]

    with quiet_peft():  # peft 0.21 trips a transformers 5.x deprecation warning
        direct = PeftModel.from_pretrained(_vit(), tmp_path)
    for reloaded in (direct, load_model(tmp_path, base_model=_vit())):
        assert isinstance(reloaded, PeftModel)
        with torch.no_grad():
            torch.testing.assert_close(reloaded.eval()(**inputs).logits, expected, rtol=0, atol=0)
    with pytest.raises(ValueError, match="^base_model"):
        load_model(tmp_path)
    with pytest.raises(ValueError, match="^lora_save='adapter' needs"):
        save_federated_model(_vit(), tmp_path / "plain", lora_save="adapter")


def test_vit_b32_family_loads_local_weights(tmp_path):
    """ViT-B/32 through the factory with weights from a local file (as a pretrained checkpoint would be)."""
    source = _vit(seed=1)
    save_file(source.backbone.state_dict(), str(tmp_path / "vit.safetensors"))
    torch.manual_seed(2)
    loaded = create_model(VIT, NUM_CLASSES, pretrained_path=str(tmp_path / "vit.safetensors"), **TINY_VIT)
    assert all(torch.equal(a, b) for a, b in zip(source.state_dict().values(), loaded.state_dict().values()))


# ------------------------------------------------------------------------------------------------
# a federated round
# ------------------------------------------------------------------------------------------------
class _RecordUpdates(FederatedCallback):
    def __init__(self):
        self.updates = []

    def on_client_end(self, trainer, round_index, update, **kwargs):
        self.updates.append(update)


def _image_dataset(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 1, 16, 16, generator=g)
    labels = (x.mean(dim=(1, 2, 3)) > 0).long() + 2 * (x[:, 0, 0, 0] > 0).long()  # 4 learnable classes
    return datasets.Dataset.from_dict({"pixel_values": x.tolist(), "labels": labels.tolist()}).with_format("torch")


@pytest.mark.parametrize("algorithm", ["fedavg", "fedsam"])
def test_federated_round_exchanges_only_adapters_and_head(algorithm, tmp_path):
    model = _lora("vit")
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    num_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    args = FedTrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, fed_algorithm=algorithm, num_clients=2, clients_per_round=2,
        num_rounds=1, local_steps=2, per_device_train_batch_size=4, partition_scheme="iid", learning_rate=0.1,
        seed=3,
    )
    recorder = _RecordUpdates()
    trainer = FederatedTrainer(model, args, _image_dataset(24, 1), _image_dataset(8, 2), label_column="labels",
                               callbacks=[recorder])
    output = trainer.train()

    assert trainer.space.numel == num_trainable
    assert len(recorder.updates) == 2
    for update in recorder.updates:
        assert update.delta.numel() == num_trainable
        assert update.delta.abs().max() > 0
    assert output.params.numel() == num_trainable
    # the frozen backbone never moved; the global model is the base + the aggregated adapters and head
    assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if not p.requires_grad)
    mean_delta = torch.stack([u.delta for u in recorder.updates]).mean(0)  # iid: equal client sizes
    torch.testing.assert_close(output.params, ParameterSpace(_lora("vit")).flatten() + mean_delta)
    assert "eval_accuracy" in trainer.history[-1] and "eval_loss" in trainer.history[-1]


# ------------------------------------------------------------------------------------------------
# every model family, through the command line's parsing and run, reloaded without hf_fedflat
# ------------------------------------------------------------------------------------------------
from helpers.hf_fixtures import family_tasks, tiny_family_dir  # noqa: E402

FAMILY_TASKS = family_tasks()
SAMPLE_TEXT = {"text-classification": "a great movie", "token-classification": "alice visited new york",
               "causal-lm": "a good story"}
AUTO_CLASSES = {"text-classification": "AutoModelForSequenceClassification",
                "token-classification": "AutoModelForTokenClassification", "causal-lm": "AutoModelForCausalLM"}
# A process where `import hf_fedflat` fails: what a user without the package sees.
NO_FEDFLAT = "import sys; sys.modules['hf_fedflat'] = None\n"


def _family_data(root):
    from hf_fedflat.data.tiny_text import write_conll_data, write_instruction_data, write_sentiment_data

    return {"text-classification": write_sentiment_data(root / "sentiment", train_rows=16, test_rows=8),
            "token-classification": write_conll_data(root / "conll", train_sentences=12, test_sentences=6),
            "causal-lm": write_instruction_data(root / "alpaca", rows=12)}


def _family_tokenizer(task):
    from hf_fedflat.data.tiny_text import train_word_tokenizer, train_wordpiece_tokenizer

    if task == "token-classification":
        return train_wordpiece_tokenizer()
    return train_word_tokenizer("gpt" if task == "causal-lm" else "bert")


@pytest.fixture(scope="module")
def family_runs(tmp_path_factory):
    """Each (family, task): `hf-fedflat train`'s parsing and run, one round of LoRA (adapter saved), the merged
    model saved from the same trained model, and the trained model's logits on one sentence; then one process
    without hf_fedflat loads every adapter by its card's snippet and every merged model by its Auto class."""
    from hf_fedflat.cli.experiment import run_experiment
    from hf_fedflat.cli.parsing import parse_train_args
    from hf_fedflat.models.auto import newly_initialised_modules
    from hf_fedflat.models.lora import resolved_target_modules

    root = tmp_path_factory.mktemp("families")
    data = _family_data(root)
    cases = {}
    for family, task in FAMILY_TASKS:
        name = f"{family}-{task}"
        base = tiny_family_dir(root / name / "base", family, _family_tokenizer(task))
        argv = ["--model_name_or_path", base, "--task", task, "--dataset_name", data[task], "--use_lora", "true",
                "--lora_r", "4", "--lora_save", "adapter", "--num_rounds", "1", "--num_clients", "2",
                "--local_steps", "2", "--per_device_train_batch_size", "4", "--learning_rate", "0.05",
                "--optim", "adamw_torch", "--use_cpu", "true", "--report_to", "none", "--save_every_n_rounds", "0",
                "--disable_tqdm", "true", "--output_dir", str(root / name / "run")]
        data_args, model_args, lora_args, args = parse_train_args(argv)
        experiment, output = run_experiment(data_args, model_args, args, lora_args=lora_args)
        model = experiment.model.eval()
        ids = experiment.data.processing_class(SAMPLE_TEXT[task])["input_ids"]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0]
        merged = save_federated_model(model, root / name / "merged", lora_save="merged")
        card = (root / name / "run" / "final_model" / "README.md").read_text()
        snippet = card.split("## How to load")[1].split("```python")[1].split("```")[0]
        cases[name] = {"ids": ids, "logits": logits.tolist(), "merged": merged, "task": task,
                       "snippet": snippet.replace("path/to/this/folder", str(output.final_model_dir)),
                       "trainable": list(experiment.trainer.space.names),
                       "new_layers": list(newly_initialised_modules(model.get_base_model())),
                       "lora_b_moved": all(p.abs().max() > 0 for n, p in model.named_parameters() if "lora_B" in n),
                       "history": output.history,
                       "card_lora_row": next((line for line in card.splitlines() if line.startswith("| LoRA |")), ""),
                       "recorded_targets": yaml.safe_load((root / name / "run" / "final_model" / "run_config.yaml")
                                                          .read_text())["lora_target_modules"],
                       "targets": resolved_target_modules(model)}
    script = NO_FEDFLAT + textwrap.dedent(f"""
        import contextlib, io, json, torch, transformers
        cases = json.loads({json.dumps(json.dumps({n: {k: c[k] for k in ("ids", "merged", "task", "snippet")}
                                                   for n, c in cases.items()}))})
        auto = {AUTO_CLASSES!r}
        out = {{}}
        for name, case in cases.items():
            scope = {{}}
            with contextlib.redirect_stdout(io.StringIO()):
                exec(case["snippet"], scope)  # the card's own loading code builds `model`
            ids = torch.tensor([case["ids"]])
            merged = getattr(transformers, auto[case["task"]]).from_pretrained(case["merged"]).eval()
            with torch.no_grad():
                out[name] = {{"adapter": scope["model"].eval()(input_ids=ids).logits[0].tolist(),
                             "merged": merged(input_ids=ids).logits[0].tolist()}}
        print("RELOADED" + json.dumps(out))
    """)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return cases, json.loads(result.stdout.split("RELOADED")[1])


@pytest.mark.parametrize("family,task", FAMILY_TASKS, ids=[f"{f}-{t}" for f, t in FAMILY_TASKS])
def test_lora_trains_and_both_saved_forms_reload_to_the_trained_model_on_every_family(family_runs, family, task):
    cases, reloaded = family_runs
    case, loaded = cases[f"{family}-{task}"], reloaded[f"{family}-{task}"]
    trainable = case["trainable"]
    assert case["lora_b_moved"] and any("lora_A" in n for n in trainable)
    assert np.isfinite(case["history"][-1]["eval_loss"])
    # the layers the published checkpoint lacks (the new head; BERT's pooler; DistilBERT's pre_classifier) are
    # trained and saved with the adapter: each one's weights are in the federated vector as modules_to_save copies
    saved = {n.split(".modules_to_save.")[0].removeprefix("base_model.model.") for n in trainable
             if ".modules_to_save." in n}
    for layer in case["new_layers"]:  # the layer, or a module holding it (RoBERTa's `classifier` holds out_proj)
        parts = layer.split(".")
        assert any(".".join(parts[:i]) in saved for i in range(1, len(parts) + 1)), (layer, saved)
    if task != "causal-lm":
        assert case["new_layers"], "a published checkpoint has no task head"
    # run_config.yaml records the targets the run used (a rerun from it adapts the same layers); the card says how
    # the folder holds the model
    assert case["recorded_targets"] == case["targets"]
    assert "saved as the adapter alone" in case["card_lora_row"]
    np.testing.assert_allclose(loaded["adapter"], case["logits"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(loaded["merged"], case["logits"], rtol=1e-4, atol=1e-5)


def _tiny_distilbert_classifier(tmp_path):
    from hf_fedflat.data.tiny_text import train_word_tokenizer
    from hf_fedflat.models.arguments import ModelArguments
    from hf_fedflat.models.auto import build_auto_model

    base = tiny_family_dir(tmp_path / "distilbert", "distilbert", train_word_tokenizer("bert"))
    model = build_auto_model(ModelArguments(model_name_or_path=base), task="text-classification",
                             label_names=["neg", "pos"])
    assert type(model).__name__ == "DistilBertForSequenceClassification"
    return model


def test_targets_without_a_peft_mapping_are_the_attention_projections_and_new_layers_are_saved(tmp_path):
    """DistilBERT (no peft default): q_lin/k_lin/v_lin/out_lin of each attention block get adapters; the head layers
    its MLM checkpoint lacks (pre_classifier, classifier) are trained in full, never wrapped twice."""
    from hf_fedflat.models.lora import resolved_target_modules

    model = apply_lora(_tiny_distilbert_classifier(tmp_path), LORA, task="text-classification")
    adapted = sorted({n.split(".lora_A.")[0].removeprefix("base_model.model.") for n, _ in model.named_parameters()
                      if ".lora_A." in n})
    assert adapted == [f"distilbert.transformer.layer.{i}.attention.{p}" for i in range(2)
                       for p in ("k_lin", "out_lin", "q_lin", "v_lin")]
    assert resolved_target_modules(model) == r"distilbert\.transformer\.layer\.\d+\.attention\.(k_lin|out_lin|q_lin|v_lin)"
    full = {n.split(".modules_to_save.")[0].removeprefix("base_model.model.") for n, p in model.named_parameters()
            if p.requires_grad and ".modules_to_save." in n}
    assert full == {"pre_classifier", "classifier"}


def test_all_linear_leaves_the_head_to_modules_to_save_and_a_target_on_the_head_is_refused(tmp_path):
    model = apply_lora(_tiny_distilbert_classifier(tmp_path), LoraArguments(use_lora=True, lora_target_modules="all-linear"),
                       task="text-classification")
    wrapped = {n.split(".lora_A.")[0] for n, _ in model.named_parameters() if ".lora_A." in n}
    assert wrapped and not any("classifier" in n for n in wrapped)  # peft alone would wrap pre_classifier, then fail
    with pytest.raises(ValueError, match=r"^lora_target_modules: 'q_lin,pre_classifier' matches pre_classifier, which is "
                                         r"trained in full \(modules_to_save: "):
        apply_lora(_tiny_distilbert_classifier(tmp_path), LoraArguments(use_lora=True,
                   lora_target_modules="q_lin,pre_classifier"), task="text-classification")
