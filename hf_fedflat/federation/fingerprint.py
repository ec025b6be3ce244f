"""What a resume must match: the run's fingerprint, in two tiers.

A checkpoint records, in ``federated_state.json``'s ``fingerprint``, every value that decides the run's math. On
resume each is compared with this run's (:class:`~.checkpoint.RunCheckpoints`):

* **the run's identity** (:data:`IDENTITY_FIELDS`, and the model, data and partition digests below) never changes
  within a run, not even with ``allow_config_change``: the checkpoint's weights and client states belong to that
  algorithm, those clients, that data and that model. A difference is refused naming the field.
* **the settings** (:data:`SETTING_FIELDS`, every hyperparameter of the run's pieces and the strategy's own, plus
  ``learning_rate``, ``clients_per_round``, ``lr_decay_per_round`` recorded under ``settings``) change only with
  ``allow_config_change``: refused naming the field without it, taken and recorded in ``config_changes``
  (``history.json`` and every later checkpoint) with it.

The model is identified by its class, ``config.model_type``, parameter count and a SHA-256 over every entry of its
``state_dict`` (name, shape, dtype), plus the frozen weights' digest under LoRA and the adapters' settings; the data
by the number of training rows and a SHA-256 of the partition (every client's row indices and label counts). The
command line adds its data, model and LoRA arguments (:func:`experiment_fingerprint`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from enum import Enum
from typing import Any

import numpy as np

__all__ = ["IDENTITY_FIELDS", "SETTING_FIELDS", "canonical", "experiment_fingerprint", "identity_names",
           "model_fingerprint", "partition_fingerprint", "run_fingerprint"]

#: FedTrainingArguments fields that identify the run (never changed by a resume)
IDENTITY_FIELDS = (
    "fed_algorithm", "perturbation", "corrections", "aggregator", "num_clients", "seed", "partition_scheme",
    "dirichlet_alpha", "classes_per_client", "min_partition_size", "effective_partition_seed", "batchnorm_buffers",
)
#: the local training and aggregation settings a resume changes only with ``allow_config_change`` (besides the
#: pieces' hyperparameters and the run settings of :data:`~.checkpoint.GUARDED_SETTINGS`)
SETTING_FIELDS = (
    "local_epochs", "local_steps", "per_device_train_batch_size", "gradient_accumulation_steps", "max_grad_norm",
    "optim", "optim_args", "optim_target_modules", "adam_beta1", "adam_beta2", "adam_epsilon", "weight_decay",
    "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps", "label_smoothing_factor", "neftune_noise_alpha",
    "bf16", "fp16", "dataloader_drop_last", "train_sampling_strategy", "aggregation_weights", "max_update_norm",
)
#: the command line's data, model and LoRA arguments that identify the run (the rest only locate files, shape the
#: evaluation or the saved model: ``data_dir``, ``dataset_path``, ``pretrained_path``, ``eval_split``, ...)
_EXPERIMENT_IDENTITY = {
    "DataArguments": ("dataset_name", "dataset_config_name", "train_split", "text_column", "max_seq_length",
                      "instruction_column", "input_column", "response_column", "prompt_template", "max_train_samples",
                      "partition_by", "test_fraction", "split_seed", "held_out_domain", "clients_per_domain",
                      "image_column", "label_column", "domain_column", "max_clients", "synthetic_alpha",
                      "synthetic_beta", "synthetic_num_users", "synthetic_iid", "max_samples_per_client", "smoke",
                      "drop_invalid_rows", "label_all_tokens"),
    "ModelArguments": ("model_name", "model_name_or_path", "task", "model_dtype", "image_size", "pretrained",
                       "model_kwargs"),
    "LoraArguments": ("use_lora", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules",
                      "lora_modules_to_save"),
}
#: the command line's arguments a resume changes only with ``allow_config_change`` (where the files are)
_EXPERIMENT_SETTINGS = {"DataArguments": ("dataset_path", "data_dir", "train_augmentation"),
                        "ModelArguments": ("pretrained_path",)}
#: digests and descriptions this module adds (identity)
DERIVED_IDENTITY = ("model_class", "model_type", "num_parameters", "parameters_sha256", "frozen_parameters_sha256",
                    "lora", "train_rows", "partition_sha256")


def canonical(value: Any) -> Any:
    """``value`` as JSON would store it, sets sorted and enums by their value (so that equal settings compare
    equal across processes and Python hash seeds)."""
    if isinstance(value, Enum):
        return canonical(value.value)
    if isinstance(value, (set, frozenset)):
        return sorted((canonical(v) for v in value), key=repr)
    if isinstance(value, dict):
        return {str(k): canonical(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [canonical(v) for v in value]
    return json.loads(json.dumps(value, default=str))


def identity_names(fingerprint: dict[str, Any], experiment_settings: tuple[str, ...] = ()) -> set[str]:
    """The names of ``fingerprint`` that identify the run (see the module docstring)."""
    fixed = set(IDENTITY_FIELDS) | set(DERIVED_IDENTITY)
    fixed |= {name for names in _EXPERIMENT_IDENTITY.values() for name in names}
    return {name for name in fingerprint if name in fixed and name not in experiment_settings}


def _digest(items) -> str:
    digest = hashlib.sha256()
    for item in items:
        digest.update(repr(item).encode())
        digest.update(b"\0")
    return digest.hexdigest()


def model_fingerprint(model) -> dict[str, Any]:
    """Class, ``config.model_type`` and SHA-256 of the ``state_dict``'s names, shapes and dtypes; for a peft (LoRA)
    model also the adapters' settings (the trainable parameter count is the trainer's ``space.numel``)."""
    inner = model
    values: dict[str, Any] = {}
    peft_config = getattr(model, "peft_config", None)
    if isinstance(peft_config, dict):
        inner = getattr(getattr(model, "base_model", None), "model", model)
        keep = ("peft_type", "r", "lora_alpha", "lora_dropout", "target_modules", "modules_to_save", "bias",
                "use_rslora", "use_dora")
        values["lora"] = {name: {key: canonical(getattr(cfg, key, None)) for key in keep}
                          for name, cfg in sorted(peft_config.items())}
    values["model_class"] = type(inner).__name__
    values["model_type"] = getattr(getattr(inner, "config", None), "model_type", None)
    values["parameters_sha256"] = _digest((name, tuple(t.shape), str(t.dtype))
                                          for name, t in model.state_dict().items())
    return values


def partition_fingerprint(partition, train_dataset) -> dict[str, Any]:
    """Training rows and SHA-256 of the partition (each client's row indices, then the label counts)."""
    digest = hashlib.sha256()
    for indices in partition.client_indices:
        array = np.ascontiguousarray(indices, dtype=np.int64)
        digest.update(len(array).to_bytes(8, "little"))
        digest.update(array.tobytes())
    digest.update(np.ascontiguousarray(partition.label_counts, dtype=np.int64).tobytes())
    return {"train_rows": len(train_dataset), "partition_sha256": digest.hexdigest()}


def experiment_fingerprint(*arguments) -> tuple[dict[str, Any], tuple[str, ...]]:
    """``(values, names that are settings)`` of the command line's data, model and LoRA arguments (any of them
    None is skipped)."""
    values: dict[str, Any] = {}
    settings: list[str] = []
    for args in arguments:
        if args is None or not dataclasses.is_dataclass(args):
            continue
        kind = type(args).__name__
        for name in _EXPERIMENT_IDENTITY.get(kind, ()):
            if hasattr(args, name):
                values[name] = getattr(args, name)
        for name in _EXPERIMENT_SETTINGS.get(kind, ()):
            if hasattr(args, name):
                values[name] = getattr(args, name)
                settings.append(name)
    if values.get("use_lora") is False:  # the adapter settings mean nothing without LoRA
        for name in _EXPERIMENT_IDENTITY["LoraArguments"][1:]:
            values.pop(name, None)
    return values, tuple(settings)


def run_fingerprint(args, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every value a resume compares: the identity fields, the settings, the pieces' hyperparameters, then
    ``extra`` (model, data and strategy values), canonical."""
    names = [*IDENTITY_FIELDS, *(n for n in args.algorithm_hyperparameters() if n not in IDENTITY_FIELDS),
             *(n for n in SETTING_FIELDS if hasattr(args, n))]
    values = {name: getattr(args, name) for name in dict.fromkeys(names)}
    values.update(extra or {})
    return {name: canonical(value) for name, value in values.items()}
