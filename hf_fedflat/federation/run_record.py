"""What a final model folder records about the run that made it: ``run_config.yaml`` and ``federated_config.json``.

* ``run_config.yaml``: the run's complete effective configuration (every field of the data, model, LoRA and training
  arguments as they were after parsing, presets resolved), so that ``hf-fedflat train --config run_config.yaml
  --output_dir <new folder>`` runs the same experiment again. Paths are absolute, a Hub id stays a Hub id, and
  credentials (``hub_token`` and any other ``*_token`` field) are never written.
* ``federated_config.json``: what a reader (or a model card) needs without parsing the YAML: the algorithm and its
  hyperparameters, the local optimizer and its schedule, batch sizes, local work, rounds, clients, partition, seed,
  the model (name or path, and its Hub origin) and the dataset.

>>> config = effective_run_config(data_args, model_args, lora_args, args)   # (cli.experiment does this)
>>> atomic_write_text(run_config_yaml(config), "outputs/run/final_model/run_config.yaml")
"""

from __future__ import annotations

import dataclasses
import os
from enum import Enum
from typing import Any

__all__ = ["RUN_CONFIG_NAME", "PATH_FIELDS", "effective_run_config", "federated_config", "run_config_yaml",
           "training_settings"]

RUN_CONFIG_NAME = "run_config.yaml"

#: fields that name a file or folder: written as absolute paths (a Hub id in ``model_name_or_path`` or
#: ``dataset_name``, which is no local path, stays as it is)
PATH_FIELDS = ("output_dir", "data_dir", "dataset_path", "pretrained_path", "model_name_or_path", "dataset_name",
               "smoke_dir", "client_state_dir", "logging_dir")

#: fields never written: credentials, and a resume (a rerun starts from the beginning)
_NOT_WRITTEN = ("resume_from_checkpoint",)

#: the local training settings ``federated_config.json`` records (``training``)
_TRAINING_FIELDS = ("optim", "optim_args", "learning_rate", "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps",
                    "lr_decay_per_round", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm",
                    "per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps",
                    "local_epochs", "local_steps", "label_smoothing_factor", "bf16", "fp16", "seed",
                    "server_learning_rate", "aggregation_weights", "eval_every_n_rounds")


def _plain(value: Any) -> Any:
    """``value`` as YAML/JSON can hold it: enums by value, tuples as lists, objects with ``to_dict`` as dicts."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if dataclasses.is_dataclass(value):
        return _plain(dataclasses.asdict(value))
    if hasattr(value, "to_dict"):
        return _plain(value.to_dict())
    return str(value)


def _absolute(name: str, value: Any) -> Any:
    if not isinstance(value, str) or not value:
        return value
    if name in ("model_name_or_path", "dataset_name") and not os.path.exists(value):
        return value  # a Hub id, a registered dataset's name
    return os.path.abspath(os.path.expanduser(value))


def _secret(name: str) -> bool:
    return name.endswith("token") or name in ("hub_token",)


def _fields_of(values: Any) -> dict[str, Any]:
    """Every ``init`` field of a parsed argument dataclass, as written to the YAML."""
    out: dict[str, Any] = {}
    defaults_fresh = _inherited_defaults(values)
    for f in dataclasses.fields(values):
        if not f.init or _secret(f.name) or f.name in _NOT_WRITTEN or f.name.startswith("_"):
            continue
        value = getattr(values, f.name)
        if value is None and f.default is None:
            continue  # unset, as the field's default: the rerun gets the same
        if f.name in defaults_fresh and _plain(value) == defaults_fresh[f.name]:
            continue  # an inherited Trainer field at its default: what a rerun gets without it
        value = _absolute(f.name, value) if f.name in PATH_FIELDS else value
        out[f.name] = _plain(value)
    return out


def _inherited_defaults(values: Any) -> dict[str, Any]:
    """``{field: default}`` of the ``transformers.TrainingArguments`` fields hf_fedflat does not declare itself.

    Those ~100 fields configure the local Trainer; the Trainer rewrites several of them when it is built (a string
    becomes an enum or a list, ``report_to`` is expanded), so the ones left at their declared default are not
    written: the rerun gets the same. Every field declared by hf_fedflat (federated, algorithm, data, model, LoRA,
    and the Trainer fields whose defaults it changes) is written whatever its value."""
    from transformers import TrainingArguments

    if not isinstance(values, TrainingArguments):
        return {}
    own = {name for cls in type(values).__mro__ if dataclasses.is_dataclass(cls) and cls.__module__.startswith("hf_fedflat")
           for name in vars(cls).get("__annotations__", {})}
    defaults: dict[str, Any] = {}
    for f in dataclasses.fields(TrainingArguments):
        if f.name in own or not f.init:
            continue
        if f.default is not dataclasses.MISSING:
            defaults[f.name] = _plain(f.default)
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            defaults[f.name] = _plain(f.default_factory())  # type: ignore[misc]
    return defaults


def effective_run_config(data_args: Any, model_args: Any, lora_args: Any, args: Any) -> dict[str, Any]:
    """The run's configuration as one flat ``field: value`` mapping that ``hf-fedflat train --config`` reads.

    Args:
        data_args, model_args, lora_args, args: the parsed ``DataArguments``, ``ModelArguments``, ``LoraArguments``
            (or None) and ``FedTrainingArguments`` of the run, as the run used them (after the data decided
            ``num_clients``, presets resolved).

    Returns:
        ``{field: value}``, in the order data, model, LoRA, training; paths absolute; no credentials.
    """
    config: dict[str, Any] = {}
    for values in (data_args, model_args, lora_args, args):
        if values is not None:
            config.update(_fields_of(values))
    for name in getattr(args, "_defaulted_fields", ()):  # taken from the preset or the pieces: left unset, so the
        if name in config:                                # rerun resolves them the same way and counts none as given
            config[name] = None
    smoke_dir, output_dir = config.get("smoke_dir"), config.get("output_dir")
    if smoke_dir and output_dir and smoke_dir == os.path.join(output_dir, "smoke_data"):
        config["smoke_dir"] = None  # the run's own default: a rerun writes it into its own folder
    return config


def run_config_yaml(config: dict[str, Any], resolved: dict[str, Any] | None = None) -> str:
    """``config`` as the text of ``run_config.yaml`` (keys in the given order, with a header saying how to rerun).

    ``resolved``: values the run took from its preset or pieces for fields left unset (``null`` in the file), shown
    as a comment on their line."""
    import yaml

    header = ("# The complete configuration of this run, as it ran (hf_fedflat). Rerun it with\n"
              "#   hf-fedflat train --config run_config.yaml --output_dir <a new folder>\n"
              "# (flags given on the command line win over this file). A null hyperparameter takes the preset's or\n"
              "# the piece's default, the value in its comment.\n")
    lines = yaml.safe_dump(config, sort_keys=False, default_flow_style=False, allow_unicode=True).splitlines()
    for i, line in enumerate(lines):
        name = line.split(":", 1)[0]
        if resolved and name in resolved and line == f"{name}: null":
            lines[i] = f"{line}  # {_plain(resolved[name])}"
    return header + "\n".join(lines) + "\n"


def training_settings(args: Any) -> dict[str, Any]:
    """The local optimizer, schedule, batch sizes, local work and seed of ``args`` (``federated_config.json``)."""
    return {name: _plain(getattr(args, name)) for name in _TRAINING_FIELDS if hasattr(args, name)}


def federated_config(trainer: Any) -> dict[str, Any]:
    """``federated_config.json``'s content for a ``FederatedTrainer`` about to save its final model.

    The run's ``run_config`` (set by ``hf-fedflat train`` and the recipes: :func:`effective_run_config`) adds the
    model's name or path and the dataset; ``model_card_kwargs`` adds the model's Hub origin and the dataset's id.
    """
    args, partition = trainer.args, trainer.partition
    run_config = getattr(trainer, "run_config", None) or {}
    card = getattr(trainer, "model_card_kwargs", None) or {}
    config = getattr(getattr(trainer, "model", None), "config", None)
    model = {key: run_config[key] for key in ("model_name", "model_name_or_path", "task", "pretrained",
                                               "pretrained_path", "model_kwargs") if key in run_config}
    if not model and config is not None:
        model = {"model_type": getattr(config, "model_type", None),
                 "name_or_path": getattr(config, "_name_or_path", None) or None}
    model["class"] = type(getattr(trainer, "model", None)).__name__
    model["base_model"] = card.get("base_model")
    if run_config.get("use_lora"):
        model["lora"] = {key: run_config.get(key) for key in ("lora_r", "lora_alpha", "lora_dropout",
                                                               "lora_target_modules", "lora_modules_to_save",
                                                               "lora_save")}
    dataset = {key: run_config[key] for key in ("dataset_name", "dataset_config_name", "dataset_path", "data_dir",
                                                 "train_split", "eval_split") if key in run_config}
    if card.get("dataset_name"):
        dataset.setdefault("name", card.get("dataset_name"))
    if card.get("dataset_id"):
        dataset["hub_id"] = card.get("dataset_id")
    dropped = getattr(getattr(trainer, "input_report", None), "dropped", None)
    return {
        "run_id": getattr(trainer.run_folder, "run_id", None),
        "algorithm": trainer.algorithm.describe(),
        "algorithm_hyperparameters": _plain(args.algorithm_hyperparameters())
        if hasattr(args, "algorithm_hyperparameters") else {},
        "num_clients": args.num_clients, "clients_per_round": args.num_clients_per_round,
        "num_rounds": args.num_rounds, "seed": args.seed,
        "partition": {"scheme": partition.scheme, "description": partition.describe_scheme(),
                      "alpha": partition.alpha, "seed": partition.seed},
        "training": training_settings(args),
        "model": model,
        "dataset": dataset,
        **({"dropped_invalid_rows": dropped} if dropped else {}),
        **trainer.strategy.describe(),
    }
