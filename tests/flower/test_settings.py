"""A run's settings as a Flower App's and back: arguments built in Python become settings that parse to them."""

from __future__ import annotations

import dataclasses

import pytest

from hf_fedflat.config import FedTrainingArguments
from hf_fedflat.data.arguments import DataArguments
from hf_fedflat.flower.settings import app_settings, arguments_settings, parse_run_config, run_config_values
from hf_fedflat.models.arguments import ModelArguments


def python_arguments(tmp_path, **changes):
    training = FedTrainingArguments(output_dir=str(tmp_path / "run"), fed_algorithm="fedlesam_d", num_clients=3,
                                    clients_per_round=2, num_rounds=2, local_epochs=1, optim="sgd", learning_rate=0.05,
                                    per_device_train_batch_size=64, partition_scheme="dirichlet", dirichlet_alpha=0.3,
                                    seed=42, rho=0.1, report_to="none", **changes)
    return training, DataArguments(dataset_name="digits"), ModelArguments(model_name="small_cnn", image_size=8)


def test_arguments_built_in_python_become_settings_that_parse_to_them(tmp_path):
    training, data, model = python_arguments(tmp_path)
    settings = arguments_settings(training, data, model)
    # what was set, with its value; what the preset fills in (FedLESAM-D's feddyn_alpha, lesam_direction) left unset
    values = run_config_values(settings)
    assert {k: values[k] for k in ("output_dir", "fed_algorithm", "num_clients", "clients_per_round", "num_rounds",
                                   "learning_rate", "optim", "per_device_train_batch_size", "rho", "image_size",
                                   "dataset_name", "model_name")} == {
        "output_dir": str(tmp_path / "run"), "fed_algorithm": "fedlesam_d", "num_clients": 3, "clients_per_round": 2,
        "num_rounds": 2, "learning_rate": 0.05, "optim": "sgd", "per_device_train_batch_size": 64, "rho": 0.1,
        "image_size": 8, "dataset_name": "digits", "model_name": "small_cnn"}
    assert "feddyn_alpha" not in values and "lesam_direction" not in values
    parsed = {type(a): a for a in parse_run_config(settings)}
    for arguments in (training, data, model):
        for field in dataclasses.fields(arguments):
            if field.init:
                assert getattr(parsed[type(arguments)], field.name) == getattr(arguments, field.name), field.name
    assert parsed[FedTrainingArguments].feddyn_alpha == training.feddyn_alpha == 0.1  # (the preset's, both sides)


def test_lists_travel_as_json(tmp_path):
    training, _, model = python_arguments(tmp_path)
    data = DataArguments(dataset_name="digits", generation_prompts=["Once upon", "The end"])
    settings = arguments_settings(training, data, model)
    assert settings["generation_prompts"] == 'json:["Once upon", "The end"]'
    assert parse_run_config(settings)[0].generation_prompts == ["Once upon", "The end"]


def test_a_value_that_cannot_be_a_setting_is_named(tmp_path):
    training, _, model = python_arguments(tmp_path)
    data = DataArguments(dataset_name="digits", generation_prompts={"Once upon"})  # (a set: no JSON for it)
    with pytest.raises(ValueError, match=r"^generation_prompts: \{'Once upon'\} cannot be written as an App setting"):
        arguments_settings(training, data, model)


def test_a_bad_value_is_refused_as_the_parser_refuses_it(tmp_path):
    training, data, model = python_arguments(tmp_path)
    training.rho = float("nan")
    with pytest.raises(ValueError, match=r"^rho: must be a finite number, got nan"):
        arguments_settings(training, data, model)


def test_a_field_that_parses_back_differently_is_named(tmp_path, monkeypatch):
    from hf_fedflat.flower import settings as module

    training, data, model = python_arguments(tmp_path)
    parse = module.parse_run_config

    def parse_changing_rho(run_config):  # (as a parser that normalizes a value would)
        parsed = parse(run_config)
        parsed[-1].rho = 0.2
        return parsed

    monkeypatch.setattr(module, "parse_run_config", parse_changing_rho)
    with pytest.raises(ValueError, match=r"^rho: 0\.1 cannot be written as an App setting \(parsed back, it differs"):
        arguments_settings(training, data, model)
