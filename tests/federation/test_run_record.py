"""What a final model folder records about its run (``hf_fedflat.federation.run_record``): ``run_config.yaml`` reruns
the run bit for bit from another folder and another working directory (paths absolute, no token written), and
``federated_config.json`` holds the algorithm, optimizer, schedule, batch sizes, local work, model and dataset."""

from __future__ import annotations

import json
import os

import pytest
import yaml
from safetensors.torch import load_file

from hf_fedflat.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

TOKEN = "hf_SENTINELrunconfig0123456789"
RUN = ["train", "--dataset_name", "digits", "--model_name", "small_cnn", "--image_size", "8", "--num_clients", "4",
       "--clients_per_round", "2", "--num_rounds", "2", "--local_steps", "2", "--per_device_train_batch_size", "8",
       "--learning_rate", "0.05", "--fed_algorithm", "fedsam", "--partition_scheme", "dirichlet",
       "--dirichlet_alpha", "0.5", "--seed", "3", "--use_cpu", "true", "--report_to", "none",
       "--save_every_n_rounds", "0"]


def test_run_config_reruns_the_same_run(tmp_path, monkeypatch):
    first_cwd = tmp_path / "first"
    first_cwd.mkdir()
    monkeypatch.chdir(first_cwd)
    assert main([*RUN, "--output_dir", "runs/a", "--hub_token", TOKEN]) == 0  # a relative output_dir
    final = first_cwd / "runs" / "a" / "final_model"
    text = (final / "run_config.yaml").read_text()
    assert TOKEN not in text and "hub_token" not in text
    config = yaml.safe_load(text)
    assert config["output_dir"] == str(first_cwd / "runs" / "a")  # absolute
    assert config["fed_algorithm"] == "fedsam" and config["learning_rate"] == 0.05 and config["seed"] == 3
    assert config["rho"] is None and "rho: null  # 0.05" in text  # the preset's default, resolved again on rerun

    described = json.loads((final / "federated_config.json").read_text())
    assert described["algorithm"]["perturbation"] == "sam" and described["algorithm_hyperparameters"]["rho"] == 0.05
    training = described["training"]
    assert (training["optim"], training["learning_rate"], training["lr_scheduler_type"]) == ("sgd", 0.05, "constant")
    assert (training["per_device_train_batch_size"], training["local_steps"], training["seed"]) == (8, 2, 3)
    assert described["model"]["model_name"] == "small_cnn" and described["dataset"]["dataset_name"] == "digits"
    assert (described["num_rounds"], described["num_clients"], described["clients_per_round"]) == (2, 4, 2)
    assert described["partition"]["scheme"] == "dirichlet" and described["partition"]["alpha"] == 0.5
    assert TOKEN not in (final / "federated_config.json").read_text()
    assert "hf-fedflat train --config run_config.yaml" in (final / "README.md").read_text()

    # from another working directory, into another folder given on the command line over the config's
    other_cwd = tmp_path / "second"
    other_cwd.mkdir()
    monkeypatch.chdir(other_cwd)
    again = other_cwd / "b"
    assert main(["train", "--config", str(final / "run_config.yaml"), "--output_dir", str(again)]) == 0
    expected, got = load_file(final / "model.safetensors"), load_file(again / "final_model" / "model.safetensors")
    assert expected.keys() == got.keys()
    assert all(expected[k].equal(got[k]) for k in expected)  # bit-identical
    # the folder now holds a run: a third run there is refused, unless --overwrite_output_dir says to replace it
    assert main(["train", "--config", str(final / "run_config.yaml"), "--output_dir", str(again)]) == 2
    assert main(["train", "--config", str(final / "run_config.yaml"), "--output_dir", str(again),
                 "--overwrite_output_dir", "true"]) == 0
    got = load_file(again / "final_model" / "model.safetensors")
    assert all(expected[k].equal(got[k]) for k in expected)
