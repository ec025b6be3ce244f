"""A run's configuration as a Flower App's settings, and back.

The App's ``[tool.flwr.app.config]`` table holds the run's configuration, one key per field of
``hf-fedflat train`` (a ``--config`` file's keys, with the same names), so ``flwr run APP <federation>
--run-config "num_rounds=50 resume_from_checkpoint='latest'"`` overrides any of them as a flag overrides a
config file. Flower's settings are TOML scalars: a list or mapping value (``--model_kwargs``, a list of metrics)
travels as a JSON string marked ``json:``; an empty string is an unset field. Both apps (server and client)
parse the same settings with the parser of ``hf-fedflat train``, so a value means what it means there.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from typing import Any

__all__ = ["ALWAYS_PRESENT", "DEPLOYMENT_DEFAULTS", "NODE_KEYS", "app_settings", "arguments_settings",
           "parse_run_config", "run_config_values"]

_JSON = "json:"
#: keys every App's settings hold, so that ``flwr run --run-config`` can set them (Flower overrides only keys
#: that exist): a resume, the length of the run, where the ServerApp writes
ALWAYS_PRESENT = {"resume_from_checkpoint": "", "num_rounds": None, "output_dir": None}
#: App settings of the deployment itself, not fields of ``hf-fedflat train``: how long the ServerApp waits for a
#: round's replies (a node killed mid-round is then left out of it) and, before the first round, for every client's
#: node to connect
DEPLOYMENT_DEFAULTS = {"flower_reply_timeout": 600.0, "flower_connect_timeout": 300.0}
#: the SuperNode's own settings (``flower-supernode --node-config``), never the App's
NODE_KEYS = ("partition-id", "num-partitions", "data-path", "state-dir")


def app_settings(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` (a run's ``field: value`` mapping) as Flower settings: scalars as they are, ``None`` as ``""``,
    lists and mappings as ``json:`` strings."""
    out = {}
    for key, value in config.items():
        if value is None:
            out[key] = ""
        elif isinstance(value, (bool, int, float, str)):
            out[key] = value
        else:
            out[key] = _JSON + json.dumps(value)
    return out


def run_config_values(run_config: dict[str, Any]) -> dict[str, Any]:
    """Flower settings back to the run's ``field: value`` mapping (unset fields left out)."""
    values = {}
    for key, value in run_config.items():
        if isinstance(value, str) and value.startswith(_JSON):
            value = json.loads(value[len(_JSON):])
        if value == "":
            continue
        values[key] = value
    return values


def parse_run_config(run_config: dict[str, Any], **changes: Any) -> tuple:
    """``(data_args, model_args, lora_args, training_args)`` from a Flower App's settings (``context.run_config``),
    exactly as ``hf-fedflat train --config`` parses a file holding them; ``changes`` replace settings first (the
    node's own data path and work folder; ``""`` unsets one). Bad values raise :class:`~hf_fedflat.cli.parsing.ConfigError`."""
    import yaml

    from ..cli.parsing import parse_train_args

    values = {k: v for k, v in run_config_values(run_config).items() if k not in DEPLOYMENT_DEFAULTS}
    for key, value in changes.items():  # ("" unsets a field, as in the App's settings)
        if value == "":
            values.pop(key, None)
        elif value is not None:
            values[key] = value
    with tempfile.TemporaryDirectory(prefix="hf_fedflat_app_") as folder:
        path = os.path.join(folder, "run.yaml")
        with open(path, "w", encoding="utf-8") as f:
            yaml.safe_dump(values, f)
        return parse_train_args(["--config", path])


def arguments_settings(training_args, *other_arguments) -> dict[str, Any]:
    """The App settings of arguments built in Python (``FedTrainingArguments`` and, optionally, the
    ``DataArguments`` / ``ModelArguments`` / ``LoraArguments`` of ``hf-fedflat train``): the run's configuration as
    its ``run_config.yaml`` records it (:func:`~hf_fedflat.federation.run_record.effective_run_config`: what the
    preset fills in left to the preset, paths absolute, no credentials). Parsing them back gives the same arguments,
    field for field (checked here: a field that does not survive the trip raises ``ValueError`` naming it)."""
    from ..data.arguments import DataArguments
    from ..federation.run_record import PATH_FIELDS, effective_run_config
    from ..models.arguments import ModelArguments
    from ..models.lora import LoraArguments

    def given(kind):
        return next((a for a in other_arguments if isinstance(a, kind)), None)

    settings = app_settings(effective_run_config(given(DataArguments), given(ModelArguments), given(LoraArguments),
                                                 training_args))
    parsed = {type(a): a for a in parse_run_config(settings)}
    for arguments in (training_args, *other_arguments):
        for field in dataclasses.fields(arguments):
            value, back = getattr(arguments, field.name), getattr(parsed[type(arguments)], field.name)
            if field.name in PATH_FIELDS and isinstance(value, str) and value and back == os.path.abspath(value):
                continue
            if field.init and value != back:
                raise ValueError(f"{field.name}: {value!r} cannot be written as an App setting (parsed back, it "
                                 "differs); give the run as a config file instead.")
    return settings
