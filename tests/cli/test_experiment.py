"""The local optimizer a run gets when ``--optim`` / ``--learning_rate`` are left unset, through ``hf-fedflat train``:
AdamW at the Trainer's 5e-5 (LoRA 2e-4) for a transformers model, the papers' SGD at 0.01 for the built-in models and
for an algorithm that assumes plain SGD (SCAFFOLD), and whatever the user gives (flag or config file) wins. Then a
tiny BERT under those defaults learns a synthetic sentiment task in 4 rounds (SGD at 0.01 stays at chance)."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from hf_fedflat.cli import main
from hf_fedflat.cli.experiment import run_experiment
from hf_fedflat.cli.parsing import parse_train_args
from hf_fedflat.data.tiny_text import write_sentiment_data, write_tiny_model
from hf_fedflat.federation.trainer import FederatedCallback

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one intra-op thread

ONE_STEP = ["--num_clients", "2", "--clients_per_round", "1", "--num_rounds", "1", "--local_steps", "1",
            "--use_cpu", "true", "--report_to", "none", "--disable_tqdm", "true"]


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("defaults")
    return {"bert": write_tiny_model(root / "bert", "bert"),
            "sentiment": write_sentiment_data(root / "sentiment", train_rows=1000, test_rows=200)}


def bert_run(assets, out, *extra) -> list[str]:
    return ["train", "--model_name_or_path", assets["bert"], "--dataset_name", assets["sentiment"],
            "--output_dir", str(out), *ONE_STEP, *extra]


def train(argv, caplog) -> tuple[dict, str]:
    """``(the last history record, the logs)`` of a CLI run."""
    with caplog.at_level(logging.INFO):
        assert main(argv) == 0
    out = argv[argv.index("--output_dir") + 1]
    with open(f"{out}/history.json") as handle:
        return json.load(handle)[-1], caplog.text


@pytest.mark.parametrize("extra, optim, learning_rate", [
    ((), "adamw_torch", 5e-5),                                                 # the Trainer's
    (("--use_lora", "true", "--lora_r", "4"), "adamw_torch", 2e-4),            # the LoRA rate
    (("--learning_rate", "1e-3"), "adamw_torch", 1e-3),                        # the rate given wins
    (("--optim", "sgd"), "sgd", 0.01),                                         # SGD's unset rate: the papers'
    (("--optim", "adamw_torch", "--learning_rate", "0.02"), "adamw_torch", 0.02),
], ids=["unset", "lora", "learning_rate-given", "optim-given", "both-given"])
def test_transformers_model_defaults_and_what_is_given_wins(assets, tmp_path, caplog, extra, optim, learning_rate):
    last, logs = train(bert_run(assets, tmp_path / "run", *extra), caplog)
    assert last["learning_rate"] == pytest.approx(learning_rate, rel=1e-12)
    assert f"local training: {optim}, learning_rate {learning_rate:g} (constant within a round)" in logs


def test_config_file_values_count_as_given(assets, tmp_path, caplog):
    config = tmp_path / "run.yaml"
    config.write_text("learning_rate: 0.003\n")
    last, logs = train([*bert_run(assets, tmp_path / "run"), "--config", str(config)], caplog)
    assert last["learning_rate"] == pytest.approx(0.003, rel=1e-12)
    assert "local training: adamw_torch, learning_rate 0.003" in logs
    assert "unset, so by default: optim adamw_torch: the Trainer's, for transformers and timm models" in logs


def test_scaffold_keeps_sgd_on_a_transformers_model_and_says_why(assets, tmp_path, caplog):
    last, logs = train(bert_run(assets, tmp_path / "run", "--fed_algorithm", "scaffold"), caplog)
    assert last["learning_rate"] == pytest.approx(0.01, rel=1e-12)
    assert "local training: sgd, learning_rate 0.01" in logs
    assert ("optim: left unset, it is sgd at learning_rate 0.01 for scaffold, not the AdamW of transformers models: "
            "scaffold assumes plain SGD on the clients") in logs


def test_scaffold_with_adamw_asked_is_refused_naming_the_default(assets, tmp_path, capsys):
    assert main(bert_run(assets, tmp_path / "run", "--fed_algorithm", "scaffold", "--optim", "adamw_torch")) == 2
    err = capsys.readouterr().err
    assert "error: optim: 'scaffold' assumes plain SGD on the clients" in err
    assert "left unset, optim is sgd for this algorithm, transformers models included" in err
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_built_in_model_keeps_the_papers_sgd(tmp_path, caplog):
    last, logs = train(["train", "--dataset_name", "digits", "--model_name", "small_cnn", "--output_dir",
                        str(tmp_path / "run"), *ONE_STEP], caplog)
    assert last["learning_rate"] == pytest.approx(0.01, rel=1e-12)
    assert "local training: sgd, learning_rate 0.01" in logs


class _OptimizerSeen(FederatedCallback):
    def __init__(self):
        self.seen = []

    def on_client_end(self, trainer, round_index, update, **kwargs):
        optimizer = trainer.client_trainer.optimizer
        optimizer = getattr(optimizer, "optimizer", optimizer)  # (accelerate's wrapper)
        self.seen.append((type(optimizer), optimizer.param_groups[0]["lr"]))


def test_the_clients_optimizer_is_torch_adamw_at_5e_5(assets, tmp_path):
    data_args, model_args, lora_args, args = parse_train_args(bert_run(assets, tmp_path / "run")[1:])
    seen = _OptimizerSeen()
    run_experiment(data_args, model_args, args, lora_args=lora_args, callbacks=[seen])
    assert seen.seen == [(torch.optim.AdamW, pytest.approx(5e-5, rel=1e-12))]


def test_tiny_bert_learns_in_four_rounds_with_the_defaults(assets, tmp_path, caplog):
    """One client per round, 150 local steps: the defaults' AdamW at 5e-5 reaches 1.0 by round 3 here (SGD at
    0.01, the former default, stays at 0.475-0.525 in the same set-up)."""
    argv = ["train", "--model_name_or_path", assets["bert"], "--dataset_name", assets["sentiment"],
            "--output_dir", str(tmp_path / "run"), "--num_clients", "4", "--clients_per_round", "1",
            "--partition_scheme", "iid", "--local_steps", "150", "--num_rounds", "4", "--seed", "42",
            "--use_cpu", "true", "--report_to", "none", "--disable_tqdm", "true"]
    last, _ = train(argv, caplog)
    assert last["round"] == 4 and last["eval_accuracy"] >= 0.9  # chance: 0.525 (the larger class of 200 rows)


@pytest.mark.parametrize("model_name, kwargs", [("small_cnn", {}),
                                                ("vit_tiny_patch16_224", {"patch_size": 4, "depth": 1, "embed_dim": 16,
                                                                          "num_heads": 2})])
def test_built_in_and_timm_models_name_the_classes_of_the_label_column(model_name, kwargs):
    """digits' label column is a ClassLabel of "0".."9": the model's id2label (and so the final config.json and a
    timm export's label_names) says "7", not LABEL_7."""
    import json as json_module

    from hf_fedflat.cli.experiment import build_model
    from hf_fedflat.data.arguments import DataArguments
    from hf_fedflat.data.catalog import load_data
    from hf_fedflat.models.arguments import ModelArguments

    model_args = ModelArguments(model_name=model_name, image_size=16, model_kwargs=json_module.dumps(kwargs))
    data = load_data(DataArguments("digits"), model_args, 42)
    model = build_model(model_args, data)
    assert model.config.id2label == {i: str(i) for i in range(10)}
