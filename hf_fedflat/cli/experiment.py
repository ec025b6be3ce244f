"""One federated experiment from its configuration: data + model + trainer.

The CLI (``hf-fedflat train``) and the recipes share this: four argument dataclasses, each beside its concept
(:class:`~hf_fedflat.data.arguments.DataArguments`, :class:`~hf_fedflat.models.arguments.ModelArguments`,
:class:`~hf_fedflat.models.lora.LoraArguments`, :class:`~hf_fedflat.FedTrainingArguments`) parsed by
``HfArgumentParser`` from flags or a YAML file, then one straight line: dataset (from the registry of
:mod:`hf_fedflat.data.catalog`) -> model (``hf_fedflat.models.create_model``, optionally LoRA) ->
``FederatedTrainer`` or ``DecentralizedTrainer`` -> train -> ``final_model/`` with its card.

>>> from hf_fedflat.data.arguments import DataArguments
>>> from hf_fedflat.models.arguments import ModelArguments
>>> experiment, output = run_experiment(DataArguments("digits"), ModelArguments("small_cnn", image_size=16), args)
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from typing import Any

from transformers import set_seed

from ..config import FedTrainingArguments
from ..data.arguments import DataArguments
from ..data.catalog import FederatedData, load_data
from ..field_checks import ConfigError
from ..models.arguments import ModelArguments

__all__ = ["Experiment", "build_experiment", "build_model", "build_node_experiment", "run_experiment"]

logger = logging.getLogger(__name__)


def build_model(model_args: ModelArguments, data: FederatedData, processing_class=None):
    """``create_model`` sized for ``data`` (classes, channels, resolution); with ``--model_name_or_path`` the
    Auto class of the task, labels from ``data.label_names`` (:func:`hf_fedflat.models.auto.build_auto_model`)."""
    if model_args.model_name_or_path:
        from ..models.auto import build_auto_model, resolve_task

        task = resolve_task(model_args, getattr(data, "task", None))
        names = _label_names(data)
        return build_auto_model(model_args, task=task, label_names=names,
                                num_labels=None if names or task == "causal-lm" else data.num_classes,
                                processing_class=processing_class)

    model = _create_named_model(model_args, data)
    names = _label_names(data)
    config = getattr(model, "config", None)
    if names and config is not None and len(names) == config.num_labels:  # real class names in config.json
        config.id2label = dict(enumerate(str(n) for n in names))
        config.label2id = {str(n): i for i, n in enumerate(names)}
    return model


def _label_names(data: FederatedData) -> list[str] | None:
    """The class names of ``data``: its own, else its label column's ``ClassLabel`` names (digits' "0".."9"), so
    ``id2label`` names the classes instead of ``LABEL_<i>``."""
    names = getattr(data, "label_names", None)
    if names:
        return list(names)
    import datasets

    feature = getattr(getattr(data, "train", None), "features", {}).get(getattr(data, "label_column", None) or "label")
    if isinstance(feature, datasets.ClassLabel) and len(feature.names) == data.num_classes:
        return list(feature.names)
    return None


def _create_named_model(model_args: ModelArguments, data: FederatedData):
    from ..models import create_model
    from ..models.next_char import TEXT_MODELS

    try:
        if model_args.model_name in TEXT_MODELS:
            vocab_size = getattr(data, "vocab_size", None) or data.num_classes  # next-token models: the vocabulary
            return create_model(model_args.model_name, num_classes=data.num_classes, vocab_size=vocab_size,
                                **model_args.model_kwargs_dict)
        return create_model(
            model_args.model_name, num_classes=data.num_classes, in_chans=data.in_chans,
            image_size=model_args.image_size, pretrained=model_args.pretrained,
            pretrained_path=model_args.pretrained_path, **model_args.model_kwargs_dict,
        )
    except (TypeError, ValueError, RuntimeError) as error:  # a keyword the constructor lacks, a bad size, ...
        if not model_args.model_kwargs_dict or isinstance(error, ConfigError):
            raise
        raise ConfigError(
            f"model_kwargs: {model_args.model_kwargs_dict} do not build model_name={model_args.model_name!r} "
            f"({type(error).__name__}: {error}); pass only keywords its constructor takes, with valid values."
        ) from error
    except OSError as error:  # timm's Hub download failed (offline, no token, ...)
        if model_args.pretrained and not model_args.pretrained_path:
            raise OSError(
                f"pretrained: the weights of {model_args.model_name} could not be downloaded ({error}). Pass a local "
                "file with --pretrained_path /path/to/model.safetensors, or --pretrained false to train from scratch."
            ) from error
        raise


def _partition_for_the_task(args, task, data):
    """A causal LM's rows have no class to split by: left unset, the partition scheme is iid for them (the default,
    dirichlet, splits by class), and said so; a scheme given is kept (and refused when it needs a class)."""
    from ..data.partition import LABEL_FREE_SCHEMES

    if (task != "causal-lm" or data.partition is not None or args.partition_scheme in LABEL_FREE_SCHEMES
            or "partition_scheme" in args.given_fields or not args.given_fields):
        return args
    logger.warning("partition_scheme: iid, not the default %s: a causal LM's rows have no class label to split by "
                   "(give --partition_scheme linear, or --partition_by <a column of ids>, for other splits).",
                   args.partition_scheme)
    args.partition_scheme = "iid"
    return args


def _base_model(model_args: ModelArguments, model) -> str | None:
    if model_args.base_model:
        return model_args.base_model
    if model_args.model_name_or_path:  # a Hub id, or the Hub origin a local folder records (never a local path)
        from ..models.origin import model_origin

        return model_origin(model_args.model_name_or_path).hub_id
    if model_args.pretrained and model_args.pretrained_path is None:
        cfg = getattr(getattr(model, "backbone", None), "pretrained_cfg", None) or {}
        return cfg.get("hf_hub_id")
    return None


@dataclass
class Experiment:
    """Everything :func:`build_experiment` made: ``trainer.train()`` runs it."""

    trainer: Any
    data: FederatedData
    model: Any
    args: FedTrainingArguments
    data_args: DataArguments
    model_args: ModelArguments
    card_kwargs: dict[str, Any]


def build_experiment(
    data_args: DataArguments,
    model_args: ModelArguments,
    args: FedTrainingArguments,
    *,
    lora_args=None,
    callbacks: list | None = None,
) -> Experiment:
    """Data, model and trainer for one run (nothing is trained yet).

    ``optim`` and ``learning_rate`` left unset in ``args`` are filled in for the model first
    (:meth:`~hf_fedflat.FedTrainingArguments.apply_model_defaults`: AdamW at 5e-5, LoRA 2e-4, for a transformers
    or timm model; SGD at 0.01 for the built-in models and for algorithms that assume plain SGD).
    The model is initialised after ``set_seed(args.seed)``: the same seed gives the same initial model,
    so algorithms compared with one seed start from the same weights. ``lora_args``
    (:class:`~hf_fedflat.models.lora.LoraArguments`) wraps it with peft: only adapters and head are then
    trained, sent and aggregated. A dataset that comes with its own clients (leave-one-domain-out,
    Shakespeare's roles) sets ``num_clients`` to their number. With ``push_to_hub`` a
    :class:`~hf_fedflat.hub.HubPushCallback` is added (unless one is given) with the dataset's card details.
    """
    from ..federation.reporting import run_entries
    from ..io import refuse_symlinks_in

    # optim / learning_rate the user left unset: AdamW at the Trainer's rate for transformers and timm models
    args.apply_model_defaults(model_args.follows_trainer_conventions, bool(lora_args is not None and lora_args.use_lora))
    refuse_symlinks_in(args.output_dir, run_entries(args))  # a planted link: refused before data or model load
    from ..federation.run_folder import abandon_run_folder, claim_run_folder, release_run_folder

    # the run's folder: locked, refused if it holds another run, run_status.json "running"; before any data loads
    folder = claim_run_folder(args, args.resume_from_checkpoint)
    try:
        return _build(data_args, model_args, args, lora_args, callbacks)
    except BaseException:
        abandon_run_folder(folder)  # refused or failed before training: the folder's status as it was
        release_run_folder(folder)
        raise


def build_node_experiment(data_args: DataArguments, model_args: ModelArguments, args: FedTrainingArguments, *,
                          lora_args=None, own_client: int | None = None) -> Experiment:
    """The experiment as one node of a deployed federation builds it to train its clients (``hf_fedflat.flower``):
    the same data, partition, initial model and local Trainer as :func:`build_experiment`, without claiming
    ``args.output_dir`` (the server's run folder). ``own_client``: the node's training rows are all this client's
    (its own dataset, the other clients' rows being elsewhere) instead of the run's partition of the dataset."""
    args.apply_model_defaults(model_args.follows_trainer_conventions, bool(lora_args is not None and lora_args.use_lora))
    return _build(data_args, model_args, args, lora_args, None, own_client=own_client)


def _own_rows_partition(data: FederatedData, num_clients: int, client_id: int):
    """A partition of ``num_clients`` clients in which ``client_id`` holds every training row of ``data``."""
    import numpy as np

    from ..data.partition import ClientPartition, _read_labels_if_any

    labels, class_names = _read_labels_if_any(data.train, data.label_column)
    indices = [np.arange(len(data.train)) if c == client_id else np.zeros(0, dtype=np.int64)
               for c in range(num_clients)]
    counts = np.zeros((num_clients, len(class_names)), dtype=np.int64)
    counts[client_id] = np.bincount(labels, minlength=len(class_names))
    return ClientPartition(client_indices=indices, label_counts=counts, scheme="node", alpha=None, seed=0,
                           class_names=class_names, num_rows=len(data.train))


def _build(data_args, model_args, args, lora_args, callbacks, own_client: int | None = None) -> Experiment:
    from ..federation.fingerprint import experiment_fingerprint
    from ..hub import HubPushCallback

    from ..metrics.generation import read_prompts
    from ..metrics.selection import check_metrics, parse_metrics, trainer_metrics

    if data_args.smoke and data_args.smoke_dir is None:
        data_args.smoke_dir = os.path.join(args.output_dir, "smoke_data")
    # --metrics and the generation prompts against the task, before the data loads when the arguments tell the task
    metric_names = parse_metrics(data_args.metrics)
    prompts = read_prompts(data_args.generation_prompts, data_args.generation_prompts_file)
    known_task = _task_before_data(model_args)
    check_metrics(metric_names, known_task)
    _check_generation(prompts, model_args, known_task)
    data = load_data(data_args, model_args, data_args.effective_split_seed)  # the data seed, not the run's
    if own_client is not None:
        data.partition = _own_rows_partition(data, args.num_clients, own_client)
    if data.partition is not None and data.partition.num_clients != args.num_clients:
        # the data decides (domains x clients_per_domain, Shakespeare's roles); the rest of args stays
        logger.info("num_clients = %d, as the %s data comes split (%s).", data.partition.num_clients, data.name,
                    data.partition.describe_scheme())
        args = args.with_algorithm(args.fed_algorithm, num_clients=data.partition.num_clients)
    from .final_evaluation import check_final_evaluation

    check_final_evaluation(args, data)  # --do_eval / --do_predict need a held-out split
    set_seed(args.seed)
    task, processing_class = data.task, getattr(data, "processing_class", None)
    if model_args.model_name_or_path:  # a transformers model: its task, and its tokenizer / image processor
        from ..models.auto import load_processing_class, resolve_task

        task = resolve_task(model_args, data.task)
        processing_class = processing_class or load_processing_class(model_args, task)
    check_metrics(metric_names, task)
    _check_generation(prompts, model_args, task)
    args = _partition_for_the_task(args, task, data)
    model = build_model(model_args, data, processing_class)
    lora_save = "merged"
    if lora_args is not None and lora_args.use_lora:
        from ..models.lora import DEFAULT_LORA_TARGET_MODULES, apply_lora, resolved_target_modules

        model = apply_lora(model, lora_args, task=task if model_args.model_name_or_path else None)
        lora_save = lora_args.lora_save
        if lora_args.lora_target_modules == DEFAULT_LORA_TARGET_MODULES:  # the targets chosen for this model
            lora_args = dataclasses.replace(lora_args, lora_target_modules=resolved_target_modules(model))
    card_kwargs = {"dataset_name": data.name, "dataset_id": data.hub_id, "base_model": _base_model(model_args, model),
                   "task": task, "license": model_args.license}
    callbacks = list(callbacks or [])
    if getattr(args, "push_to_hub", False) and not any(isinstance(c, HubPushCallback) for c in callbacks):
        data_config = {"mean": data.mean, "std": data.std} if data.mean and data.std else None
        callbacks.append(HubPushCallback(card_kwargs=card_kwargs, data_config=data_config))
    from ..federation.trainer_factory import create_trainer  # a server loop, or gossip for a decentralized aggregator

    extra = {k: v for k, v in (("processing_class", processing_class),
                               ("data_collator", getattr(data, "data_collator", None)),
                               ("compute_metrics", getattr(data, "compute_metrics", None)),
                               ("preprocess_logits_for_metrics", getattr(data, "preprocess_logits_for_metrics", None)))
             if v is not None}
    if metric_names:  # the chosen metrics instead of the task's default (hf_fedflat.metrics.selection)
        extra.update(trainer_metrics(task, metric_names, label_names=_label_names(data),
                                     compute_metrics=extra.get("compute_metrics"),
                                     preprocess_logits_for_metrics=extra.get("preprocess_logits_for_metrics")))
    trainer = create_trainer(model, args, data.train, data.eval, partition=data.partition,
                             label_column=data.label_column, callbacks=callbacks, lora_save=lora_save,
                             drop_invalid_rows=data_args.drop_invalid_rows, **extra)
    trainer.model_card_kwargs = card_kwargs
    from ..federation.run_record import effective_run_config

    # the complete configuration, for final_model/run_config.yaml (a rerun) and federated_config.json
    trainer.run_config = effective_run_config(data_args, model_args, lora_args, args)
    if prompts:  # greedy continuations at each evaluation, into the history (hf_fedflat.metrics.generation)
        from ..metrics.generation import GenerationProbe

        trainer.eval_generation = GenerationProbe(processing_class, prompts, data_args.generation_max_new_tokens)
    # a resume must match these too (its data, model and LoRA arguments): see hf_fedflat.federation.fingerprint
    trainer.experiment_fingerprint, trainer.experiment_settings = experiment_fingerprint(data_args, model_args,
                                                                                         lora_args)
    if data.mean and data.std:  # recorded in timm's pretrained_cfg of a timm-layout final model
        trainer.data_config = {"mean": tuple(data.mean), "std": tuple(data.std)}
    return Experiment(trainer=trainer, data=data, model=model, args=args, data_args=data_args, model_args=model_args,
                      card_kwargs=card_kwargs)


def _task_before_data(model_args: ModelArguments) -> str | None:
    """The run's task when the arguments tell it without the data: ``--task``, a local model folder's
    ``config.json``, a named model (``word_lstm``: next-token prediction; the others classify); None otherwise."""
    if not model_args.model_name_or_path:
        return "causal-lm" if model_args.model_name == "word_lstm" else "classification"
    if model_args.task:
        return model_args.task
    config = os.path.join(os.path.expanduser(model_args.model_name_or_path), "config.json")
    if not os.path.isfile(config):
        return None  # a Hub id: known once the model's config is read, still before training
    import json

    from ..models.auto import task_from_architectures

    try:
        with open(config, encoding="utf-8") as f:
            return task_from_architectures(json.load(f))
    except (OSError, ValueError):
        return None


def _check_generation(prompts: list[str], model_args: ModelArguments, task: str | None) -> None:
    """Generation prompts need a transformers causal LM (its ``generate`` and its tokenizer)."""
    from ..field_checks import ConfigError

    if not prompts:
        return
    if not model_args.model_name_or_path or (task is not None and task != "causal-lm"):
        raise ConfigError(f"generation_prompts: generations are for a transformers causal LM (--model_name_or_path, "
                          f"task causal-lm); this run's task is {task or model_args.model_name}.")


def run_experiment(
    data_args: DataArguments,
    model_args: ModelArguments,
    args: FedTrainingArguments,
    *,
    lora_args=None,
    callbacks: list | None = None,
):
    """Build and train (the trainer writes ``final_model/`` and its model card); returns ``(experiment, output)``.
    Then, as transformers' example scripts do, ``--do_eval`` evaluates and ``--do_predict`` predicts with the final
    model (:mod:`hf_fedflat.cli.final_evaluation`: ``eval_results.json``, ``predict_results.json``)."""
    from .final_evaluation import run_final_evaluation

    experiment = build_experiment(data_args, model_args, args, lora_args=lora_args, callbacks=callbacks)
    output = experiment.trainer.train()
    run_final_evaluation(experiment.trainer, experiment.data, experiment.args)
    return experiment, output

