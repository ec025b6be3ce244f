"""Model cards that record the federated set-up of a run.

A federated model is only reproducible with its set-up: the algorithm and its parts, how the data
was split over how many clients, how many took part per round, the local work. The card written
here records that, the metrics per round, the final numbers, the partition heatmap and the
accuracy curves, and how to load the weights (hf_fedflat, transformers, timm or peft).

Every input is explicit, so a card can be built without training:

>>> card = build_model_card(args, history=history, algorithm={"name": "fedsam", ...}, partition=partition)
>>> write_model_card("outputs/run/final_model", args)     # reads history/partition next to it
>>> write_model_card_for_trainer(trainer)                 # the same, from a FederatedTrainer

Only the fields listed in this module reach the card: never the Hub token or other credentials.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from huggingface_hub import EvalResult, ModelCard, ModelCardData

__all__ = [
    "CARD_NAME",
    "CURVES_IMAGE",
    "FEDFLAT_SUBFOLDER",
    "LAYOUTS",
    "PARTITION_IMAGE",
    "PART_HYPERPARAMETERS",
    "RUN_CONFIG",
    "build_model_card",
    "card_inputs_from_trainer",
    "detect_layout",
    "history_metrics",
    "lora_settings",
    "lower_is_better",
    "model_card_from_trainer",
    "pipeline_tag",
    "plot_metrics",
    "primary_metric",
    "select_table_rows",
    "write_model_card",
    "write_model_card_for_trainer",
]

CARD_NAME = "README.md"
PARTITION_IMAGE = "partition_heatmap.png"
CURVES_IMAGE = "training_curves.png"
RUN_CONFIG = "run_config.yaml"
"""The file beside the final model that reruns the run (``hf-fedflat train --config run_config.yaml``)."""
FEDFLAT_SUBFOLDER = "hf_fedflat"
"""Where the hf_fedflat files (``save_pretrained`` + ``federated_config.json``) go in a timm-layout repo."""

LAYOUTS = ("hf_fedflat", "timm", "peft")
"""How a model folder is organised, which decides the loading instructions:

* ``hf_fedflat``: ``save_pretrained`` files at the root (``config.json`` with
  ``model_type: hf_fedflat_classifier``, ``model.safetensors``), ``federated_config.json``.
* ``timm``: timm's Hub format at the root (``config.json`` with ``architecture``/``pretrained_cfg``,
  ``model.safetensors`` with timm's keys), the hf_fedflat files in :data:`FEDFLAT_SUBFOLDER`.
* ``peft``: adapter files at the root (``adapter_config.json``, ``adapter_model.safetensors``).
"""

class _PartHyperparameters(Mapping):
    """Part name -> the hyperparameter fields it reads, from the piece registry (``piece_hyperparameters``;
    a name registered as two kinds of piece, e.g. ``feddyn``, reads the union). Read on each access, so
    every piece registered by then is included; parts without hyperparameters are not listed."""

    def _table(self) -> dict[str, tuple[str, ...]]:
        from ..algorithms.registry import TABLES, piece_hyperparameters

        table: dict[str, tuple[str, ...]] = {}
        for kind, pieces in TABLES.items():
            for name in pieces:
                table[name] = tuple(dict.fromkeys((*table.get(name, ()), *piece_hyperparameters(kind, name))))
        return {name: fields for name, fields in table.items() if fields}

    def __getitem__(self, part: str) -> tuple[str, ...]:
        return self._table()[part]

    def __iter__(self):
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())


#: hyperparameter fields of ``FedTrainingArguments`` that each algorithm part reads (each piece's config
#: dataclass, through the registry). Parts without any are shown by name only.
PART_HYPERPARAMETERS: Mapping[str, tuple[str, ...]] = _PartHyperparameters()

#: history keys that are no metric of the model (timings, counts): never a column or a result
_NOT_METRICS = ("eval_runtime", "eval_samples_per_second", "eval_steps_per_second", "eval_tokens", "eval_seconds")
#: the metric "best" refers to, by task, in order of preference (the first one the history has)
_PRIMARY_METRICS = {
    "causal-lm": ("eval_perplexity", "eval_loss"), "text-generation": ("eval_perplexity", "eval_loss"),
    "token-classification": ("eval_f1", "eval_overall_f1", "eval_accuracy", "eval_loss"),
}
_DEFAULT_PRIMARY = ("eval_accuracy", "eval_f1_macro", "eval_f1", "eval_loss")
#: tasks whose partition is by class label ("classes per client" is shown for them only)
_CLASSIFICATION_TASKS = ("image-classification", "text-classification")


def lower_is_better(metric: str) -> bool:
    """Losses and perplexities fall as the model improves; every other metric rises."""
    return "loss" in metric or "perplexity" in metric


def history_metrics(history: Sequence[Mapping[str, Any]]) -> list[str]:
    """The evaluation metrics the history records (``eval_*`` keys with a number in some round), ``eval_loss``
    first, then in the order they appear: whatever metrics the run computed, with no list to keep up to date."""
    keys: dict[str, None] = {}
    for record in history:
        for key, value in record.items():
            if key.startswith("eval_") and key not in _NOT_METRICS and _number(value) is not None:
                keys.setdefault(key)
    return sorted(keys, key=lambda k: k != "eval_loss")


def primary_metric(history: Sequence[Mapping[str, Any]], task: str | None = None) -> str | None:
    """The metric the card's "best" refers to: by task (perplexity for a causal LM, entity F1 for token
    classification, accuracy for classification), else the first evaluation metric the history has."""
    present = history_metrics(history)
    for key in _PRIMARY_METRICS.get(task or "", _DEFAULT_PRIMARY):
        if key in present:
            return key
    return next((k for k in present if k != "eval_loss"), present[0] if present else None)


def _table_columns(history: Sequence[Mapping[str, Any]]) -> list[str]:
    """``round``, then the columns some round has a number for: no empty column."""
    columns = ["round"]
    if any(_number(r.get("train_loss")) is not None for r in history):
        columns.append("train_loss")
    columns += history_metrics(history)
    if any(_number(r.get("dp_epsilon")) is not None for r in history):
        columns.append("dp_epsilon")
    if any(_number(r.get("round_seconds")) is not None for r in history):
        columns.append("round_seconds")
    return columns


def _privacy_rows(args: Any, history: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """The client-level DP guarantee of a run that recorded the epsilon spent (``dp_epsilon``); none otherwise."""
    spent = [_number(r.get("dp_epsilon")) for r in history if _number(r.get("dp_epsilon")) is not None]
    if not spent:
        return []
    from ..privacy import ACCOUNTANT, NEIGHBOURING_RELATION

    delta, clip, sigma = _get(args, "dp_delta"), _get(args, "dp_clip_norm"), _get(args, "dp_noise_multiplier")
    num_clients, per_round = _get(args, "num_clients"), _clients_per_round(args)
    where = ("by each client before its update leaves it (a share N(0, sigma^2 C^2 / max(n_t, m)) each)"
             if _get(args, "dp_noise") == "client" else "by the server to the sum of the clipped updates")
    rows = [("guarantee", f"({spent[-1]:.4g}, {float(delta):.4g})-differential privacy at client level after "
                          f"{len(spent)} rounds"
                          + (f" (budget {_hp(_get(args, 'dp_target_epsilon'))})"
                             if _get(args, "dp_target_epsilon") is not None else "")),
            ("neighbouring datasets", NEIGHBOURING_RELATION),
            ("mechanism", f"each sampled client's whole update clipped to L2 norm C = {_hp(clip)}; Gaussian noise "
                          f"of standard deviation sigma*C on the sum, sigma = {_fmt(sigma)}, added {where}; the sum "
                          f"divided by m = {per_round}"),
            ("sampling", f"Poisson: every client with probability q = {_fmt(per_round / num_clients)} per round "
                         f"({per_round} of {num_clients} expected)" if per_round and num_clients else "Poisson"),
            ("accountant", ACCOUNTANT),
            ("not covered", "what the server logs per round (train losses, which clients took part, diagnostics); "
                            "with noise on the clients and no secure aggregation, the server sees each update with "
                            "noise sigma*C/sqrt(max(n_t, m)) only"
                            + ("; the noise is seeded (reproducible): anyone who knows the seed can remove it"
                               if not _get(args, "dp_secure_rng") else ""))]
    return rows


# -------------------------------------------------------------------------------------------------
# reading the inputs
# -------------------------------------------------------------------------------------------------
def _get(args: Any, name: str, default: Any = None) -> Any:
    """A field of ``FedTrainingArguments`` or of a plain mapping of them."""
    if isinstance(args, Mapping):
        return args.get(name, default)
    return getattr(args, name, default)


def _on_cpu(args: Any) -> bool:
    if _get(args, "use_cpu"):
        return True
    device = None if isinstance(args, Mapping) else getattr(args, "device", None)
    return getattr(device, "type", None) == "cpu"


def _precision(args: Any) -> str:
    """The precision the run trained in: ``--fp16`` asks for CUDA's float16 autocast, which a CPU run does not apply
    (it trains in fp32, bit for bit as without the flag)."""
    if _get(args, "bf16"):
        return "bf16"
    if _get(args, "fp16"):
        return "fp32 (--fp16 has no effect on CPU)" if _on_cpu(args) else "fp16"
    return "fp32"


def _clients_per_round(args: Any) -> int | None:
    value = _get(args, "num_clients_per_round")
    if value is not None:
        return int(value)
    if _get(args, "clients_per_round") is not None:
        return int(_get(args, "clients_per_round"))
    num_clients, fraction = _get(args, "num_clients"), _get(args, "participation_fraction")
    if num_clients is not None and fraction is not None:
        return max(1, int(round(float(fraction) * int(num_clients))))
    return None


def _algorithm_description(args: Any, algorithm: Mapping[str, Any] | None) -> dict[str, Any]:
    """Name, parts, one-line description and paper: from ``algorithm`` (``FederatedAlgorithm.describe()``),
    completed from the preset registry when the preset is known in this install."""
    info: dict[str, Any] = dict(algorithm or {})
    if "name" not in info:  # what ran: the preset, with the parts given in its place (``dfedsam (perturbation=gam)``)
        try:
            from ..algorithms.conflicts import algorithm_label

            info["name"] = algorithm_label(_get(args, "fed_algorithm"), _get(args, "perturbation"),
                                           _get(args, "corrections"), _get(args, "aggregator"))
        except (ValueError, KeyError, TypeError):
            info["name"] = _get(args, "fed_algorithm")
    if not all(k in info for k in ("perturbation", "corrections", "aggregator")):
        try:
            from ..algorithms import resolve_parts

            perturbation, corrections, aggregator = resolve_parts(
                info["name"], _get(args, "perturbation"), _get(args, "corrections"), _get(args, "aggregator")
            )
            info.setdefault("perturbation", perturbation)
            info.setdefault("corrections", list(corrections))
            info.setdefault("aggregator", aggregator)
        except (ValueError, KeyError, TypeError):
            pass  # a preset this install does not know: show what the arguments say
    try:
        from ..algorithms import get_preset

        spec = get_preset(info["name"])  # (a name with parts given in place of the preset's is no preset: none)
        info.setdefault("description", spec.description)
        info.setdefault("paper", spec.paper)
    except (ValueError, KeyError, TypeError):
        pass
    return info


def _part_names(info: Mapping[str, Any]) -> list[str]:
    """Every part of the algorithm, a combined aggregator such as ``mean+fedgh`` split into its pieces."""
    names = [info.get("perturbation"), *(info.get("corrections") or []), info.get("aggregator")]
    return [piece for name in names if name for piece in str(name).split("+") if piece]


def _partition_object(partition: Any):
    """A ``ClientPartition`` from one, from its ``to_dict()`` form, or from a ``partition.json`` path."""
    if partition is None:
        return None
    from ..data import ClientPartition

    if isinstance(partition, ClientPartition):
        return partition
    if isinstance(partition, (str, os.PathLike)):
        return ClientPartition.load_json(partition)
    if isinstance(partition, Mapping):
        return ClientPartition.from_dict(partition)
    raise TypeError(f"partition: expected a ClientPartition, its dict or a partition.json path, got {type(partition).__name__}.")


def detect_layout(folder: str | os.PathLike) -> str:
    """The :data:`LAYOUTS` entry that describes ``folder``."""
    folder = Path(folder)
    if (folder / "adapter_config.json").is_file():
        return "peft"
    config = folder / "config.json"
    if config.is_file():
        try:
            data = json.loads(config.read_text())
        except json.JSONDecodeError:
            data = {}
        if "pretrained_cfg" in data and "model_type" not in data:
            return "timm"
    return "hf_fedflat"


# -------------------------------------------------------------------------------------------------
# formatting helpers
# -------------------------------------------------------------------------------------------------
def _fmt(value: Any, digits: int = 4) -> str:
    """A metric value for a table cell (``digits`` decimals)."""
    value = getattr(value, "value", value)  # enums (OptimizerNames.SGD -> "sgd")
    if value is None:
        return "–"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return f"{value:.{digits}f}" if abs(value) >= 1e-3 or value == 0 else f"{value:.3g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(_fmt(v, digits) for v in value) if value else "–"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _hp(value: Any) -> str:
    """A hyperparameter as written in a config (``0.05``, ``10``, ``sgd``)."""
    value = getattr(value, "value", value)
    if isinstance(value, float) and not isinstance(value, bool):
        return f"{value:g}"
    return _fmt(value)


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_fmt(v, 2 if "seconds" in str(h) else 4) for h, v in zip(header, row)) + " |"
              for row in rows]
    return "\n".join(lines)


def _number(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def select_table_rows(history: Sequence[Mapping[str, Any]], max_rows: int,
                      metric: str | None = "eval_accuracy") -> tuple[list[int], int]:
    """Indices of the records shown in the per-round table, and the stride ``k`` used.

    Up to ``max_rows`` records: all of them; beyond, every ``k``-th round plus the first, the best
    (by ``metric``: highest, or lowest for a loss or perplexity) and the last, with
    ``k = ceil(n / (max_rows - 3))`` so the table stays near ``max_rows`` lines.
    """
    n = len(history)
    if n <= max_rows:
        return list(range(n)), 1
    k = math.ceil(n / max(1, max_rows - 3))
    keep = {i for i in range(n) if (i + 1) % k == 0} | {0, n - 1}
    best = _best_index(history, metric)
    if best is not None:
        keep.add(best)
    return sorted(keep), k


def _best_index(history: Sequence[Mapping[str, Any]], metric: str | None) -> int | None:
    values = [(_number(r.get(metric)), i) for i, r in enumerate(history)] if metric else []
    values = [(v, i) for v, i in values if v is not None]
    if not values:
        return None
    sign = -1.0 if lower_is_better(metric) else 1.0
    return max(values, key=lambda vi: (sign * vi[0], -vi[1]))[1]  # the first round reaching the best value


def _final_metrics(history: Sequence[Mapping[str, Any]], task: str | None = None) -> dict[str, Any]:
    """Rounds completed; the last evaluated round's value of every metric (``final_<key>``); the best value of the
    primary metric and its round; the last train loss; round and wall-clock seconds."""
    out: dict[str, Any] = {"rounds_completed": len(history)}
    if not history:
        return out
    metric = primary_metric(history, task)
    metrics = history_metrics(history)
    evaluated = [r for r in history if any(_number(r.get(k)) is not None for k in metrics)]
    if evaluated:
        last = evaluated[-1]
        if metric is not None and _number(last.get(metric)) is not None:
            out[f"final_{metric}"] = float(last[metric])
        best = _best_index(history, metric)
        if best is not None:
            out[f"best_{metric}"] = float(history[best][metric])
            out["best_round"] = int(history[best].get("round", best + 1))
        for key in metrics:
            if key != metric and _number(last.get(key)) is not None:
                out[f"final_{key}"] = float(last[key])
    if _number(history[-1].get("train_loss")) is not None:
        out["final_train_loss"] = float(history[-1]["train_loss"])
    seconds = [float(r["round_seconds"]) for r in history if _number(r.get("round_seconds")) is not None]
    if seconds:
        out["mean_round_seconds"] = float(np.mean(seconds))
    if _number(history[-1].get("wall_seconds")) is not None:
        out["wall_seconds"] = float(history[-1]["wall_seconds"])
    return out


# -------------------------------------------------------------------------------------------------
# sections
# -------------------------------------------------------------------------------------------------
def _lora_text(lora: Mapping[str, Any]) -> str:
    """The LoRA settings as one cell: rank, alpha, dropout, target modules, modules trained in full, how saved."""
    def names(value: Any) -> str:
        if isinstance(value, str):
            return f"`{value}`"
        return ", ".join(f"`{v}`" for v in sorted(value)) if value else "–"

    parts = [f"r {lora.get('r')}", f"alpha {_hp(lora.get('lora_alpha'))}", f"dropout {_hp(lora.get('lora_dropout'))}",
             f"target modules {names(lora.get('target_modules'))}"]
    if lora.get("modules_to_save"):
        parts.append(f"trained in full {names(lora['modules_to_save'])}")
    if lora.get("save"):
        parts.append("saved as the adapter alone" if lora["save"] == "adapter" else "merged into the saved weights")
    return ", ".join(parts)


def lora_settings(source: Any) -> dict[str, Any] | None:
    """LoRA settings for the card, in peft's names (``r``, ``lora_alpha``, ``lora_dropout``, ``target_modules``,
    ``modules_to_save``), from a ``peft.LoraConfig``, an ``adapter_config.json`` mapping, or a run config's
    ``lora_*`` fields (``run_config.yaml``); None when the source has no LoRA."""
    if source is None:
        return None
    if not isinstance(source, Mapping):
        source = source.to_dict() if hasattr(source, "to_dict") else vars(source)
    if "use_lora" in source or "lora_r" in source:  # a run config
        if not source.get("use_lora"):
            return None
        return {"r": source.get("lora_r"), "lora_alpha": source.get("lora_alpha"),
                "lora_dropout": source.get("lora_dropout"), "target_modules": source.get("lora_target_modules"),
                "modules_to_save": source.get("lora_modules_to_save"), "save": source.get("lora_save")}
    if str(getattr(source.get("peft_type"), "value", source.get("peft_type"))).upper() != "LORA":
        return None
    return {key: source.get(key) for key in ("r", "lora_alpha", "lora_dropout", "target_modules", "modules_to_save",
                                             "save")}  # save: how the folder holds it, when the caller knows


def _setup_rows(args: Any, info: Mapping[str, Any], partition, history: Sequence[Mapping[str, Any]],
                task: str | None = None, lora: Mapping[str, Any] | None = None) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    corrections = list(info.get("corrections") or [])
    parts = (f"perturbation `{info.get('perturbation', '?')}`, corrections "
             f"{', '.join(f'`{c}`' for c in corrections) if corrections else '–'}, aggregator `{info.get('aggregator', '?')}`")
    rows.append(("algorithm", f"`{info.get('name')}`: {parts}"))
    if info.get("description"):
        rows.append(("description", str(info["description"])))
    if info.get("paper"):
        rows.append(("reference", str(info["paper"])))
    hyper: dict[str, Any] = {}
    for part in _part_names(info):
        for name in PART_HYPERPARAMETERS.get(part, ()):
            if _get(args, name) is not None:
                hyper[name] = _get(args, name)
    if hyper:
        rows.append(("algorithm hyperparameters", ", ".join(f"`{k}={_hp(v)}`" for k, v in hyper.items())))
    num_clients, per_round = _get(args, "num_clients"), _clients_per_round(args)
    if num_clients is not None:
        participation = f" ({per_round} per round, {100.0 * per_round / num_clients:.3g}% participation)" if per_round else ""
        rows.append(("clients", f"{num_clients}{participation}"))
    if _get(args, "num_rounds") is not None:
        done = f" ({len(history)} completed)" if history and len(history) != _get(args, "num_rounds") else ""
        rows.append(("rounds", f"{_get(args, 'num_rounds')}{done}"))
    scheme = _get(args, "partition_scheme")
    if partition is not None:
        rows.append(("partition", f"`{partition.describe_scheme()}`, seed {partition.seed}"))
        sizes = np.asarray(partition.num_samples)
        classes = (partition.label_counts > 0).sum(axis=1)
        rows.append(("samples per client", f"{int(sizes.sum())} in total; min {sizes.min()} / median {np.median(sizes):g} / max {sizes.max()}"))
        if task is None or task in _CLASSIFICATION_TASKS:  # (a language model's "classes" are no labels)
            rows.append(("classes per client", f"{partition.num_classes} classes; min {classes.min()} / median "
                                               f"{np.median(classes):g} / max {classes.max()}"))
    elif scheme is not None:
        detail = ""
        if scheme in ("dirichlet", "inner_dirichlet"):
            detail = f"(alpha={_hp(_get(args, 'dirichlet_alpha'))})"
        elif scheme == "pathological":
            detail = f"(classes_per_client={_get(args, 'classes_per_client')})"
        seed = _get(args, "partition_seed")
        seed = _get(args, "seed") if seed is None else seed
        rows.append(("partition", f"`{scheme}{detail}`, seed {seed}"))
    local_steps = _get(args, "local_steps")
    if local_steps:
        local = f"{local_steps} steps per round"
    else:
        epochs = _get(args, "local_epochs")
        local = f"{_hp(epochs)} epoch{'' if epochs == 1 else 's'} per round"
    steps = [float(r["local_steps"]) for r in history if _number(r.get("local_steps")) is not None]
    if steps and not local_steps:
        local += f" (mean {np.mean(steps):.3g} steps)"
    rows.append(("local work", local))
    lr, decay = _get(args, "learning_rate"), _get(args, "lr_decay_per_round", 1.0)
    lr_text = f"{_hp(lr)}" + (f" x {_hp(decay)}^round" if decay not in (None, 1, 1.0) else " (constant across rounds)")
    batch = _get(args, "per_device_train_batch_size")
    accumulation = _get(args, "gradient_accumulation_steps", 1)
    optim = _hp(_get(args, "optim")) if _get(args, "optim") else None
    optim_args = _get(args, "optim_args")
    betas = (f"betas ({_hp(_get(args, 'adam_beta1'))}, {_hp(_get(args, 'adam_beta2'))}), eps {_hp(_get(args, 'adam_epsilon'))}"
             if optim and "adam" in optim and _get(args, "adam_beta1") is not None else None)
    optimizer = [f"`{optim}`" if optim else None,
                 (f"optim_args `{optim_args}`" if optim_args else
                  "no momentum (plain SGD)" if optim == "sgd" else None), betas, f"lr {lr_text}",
                 f"batch size {batch}" + (f" x {accumulation} accumulation steps" if accumulation and accumulation > 1 else ""),
                 f"gradient clipping at norm {_hp(_get(args, 'max_grad_norm'))}" if _get(args, "max_grad_norm") else None,
                 f"weight decay {_hp(_get(args, 'weight_decay'))}" if _get(args, "weight_decay") else None]
    rows.append(("local optimizer", ", ".join(p for p in optimizer if p)))
    if lora:
        rows.append(("LoRA", _lora_text(lora)))
    rows.append(("precision", _precision(args)))
    server = [f"learning rate {_hp(_get(args, 'server_learning_rate'))}" if _get(args, "server_learning_rate") is not None else None,
              f"aggregation weights by {_get(args, 'aggregation_weights')}" if _get(args, "aggregation_weights") else None]
    if any(server):
        rows.append(("server", ", ".join(p for p in server if p)))
    if _get(args, "seed") is not None:
        rows.append(("seed", str(_get(args, "seed"))))
    return rows


_FEDFLAT_MODEL_TYPES = {"hf_fedflat_classifier": ("FedFlatImageClassifier", "AutoModelForImageClassification"),
                         "hf_fedflat_char_lstm": ("CharLSTMModel", "AutoModelForSequenceClassification"),
                         "hf_fedflat_char_transformer": ("CharTransformerModel", "AutoModelForSequenceClassification")}
_TASK_AUTO = {"image-classification": "AutoModelForImageClassification",
              "text-classification": "AutoModelForSequenceClassification",
              "token-classification": "AutoModelForTokenClassification",
              "causal-lm": "AutoModelForCausalLM", "text-generation": "AutoModelForCausalLM"}
_TASK_PEFT = {"text-classification": "AutoPeftModelForSequenceClassification",
              "token-classification": "AutoPeftModelForTokenClassification",
              "causal-lm": "AutoPeftModelForCausalLM", "text-generation": "AutoPeftModelForCausalLM"}
_TASK_EXAMPLE = {"text-classification": ('classifier = pipeline("text-classification", model=model, tokenizer=tokenizer)',
                                         'print(classifier("a great movie"))'),
                 "token-classification": ('tagger = pipeline("token-classification", model=model, tokenizer=tokenizer)',
                                          'print(tagger("a great movie"))'),
                 "causal-lm": ('generator = pipeline("text-generation", model=model, tokenizer=tokenizer)',
                               'print(generator("a great", max_new_tokens=8)[0]["generated_text"])')}
_TASK_EXAMPLE["text-generation"] = _TASK_EXAMPLE["causal-lm"]


def pipeline_tag(task: str | None) -> str | None:
    """The Hub ``pipeline_tag`` of a run's task (``causal-lm`` -> ``text-generation``; others as they are)."""
    return {"causal-lm": "text-generation"}.get(task, task) if task else None


def _transformers_snippet(ref: str, task: str | None, model_config: Mapping[str, Any]) -> str:
    """Loading a plain transformers model (from ``--model_name_or_path``) with its Auto class and ``pipeline``."""
    auto = _TASK_AUTO.get(task or "", "AutoModel")
    lines = ["A standard `transformers` model: no hf_fedflat needed to use it.", "", "```python"]
    if task == "image-classification":
        lines += [f"from transformers import {auto}, AutoImageProcessor, pipeline",
                  f'model = {auto}.from_pretrained("{ref}")',
                  f'processor = AutoImageProcessor.from_pretrained("{ref}")',
                  'classifier = pipeline("image-classification", model=model, image_processor=processor)']
    else:
        lines += [f"from transformers import {auto}, AutoTokenizer, pipeline",
                  f'model = {auto}.from_pretrained("{ref}")',
                  f'tokenizer = AutoTokenizer.from_pretrained("{ref}")', *_TASK_EXAMPLE.get(task or "", ())]
    return "\n".join([*lines, "```"])


def _loading_section(layout: str, repo: str | None, model_config: Mapping[str, Any] | None,
                     task: str | None = None) -> str:
    local = "path/to/this/folder"
    ref = repo or local  # a card written next to the weights (not pushed yet) loads them from its folder
    model_type = (model_config or {}).get("model_type")
    if layout == "timm":
        return "\n".join([
            "The repository root is in timm's format; the same weights in hf_fedflat's format are in "
            f"`{FEDFLAT_SUBFOLDER}/`.",
            "",
            "```python",
            "import timm",
            f'model = timm.create_model("hf-hub:{repo}", pretrained=True)' if repo else
            f'model = timm.create_model("local-dir:{local}", pretrained=True)',
            f'# local copy: timm.create_model("local-dir:{local}", pretrained=True)' if repo else
            "# from the Hub once pushed: timm.create_model(\"hf-hub:<user>/<repo>\", pretrained=True)",
            "",
            "# transformers (TimmWrapper)",
            "from transformers import AutoModelForImageClassification",
            f'model = AutoModelForImageClassification.from_pretrained("{ref}")',
            "",
            "# hf_fedflat (FedFlatImageClassifier, returns loss and logits for the Trainer)",
            "from hf_fedflat.models import FedFlatImageClassifier, load_model",
            f'model = FedFlatImageClassifier.from_pretrained("{ref}", subfolder="{FEDFLAT_SUBFOLDER}")',
            f'# local copy: load_model("{local}/{FEDFLAT_SUBFOLDER}")',
            "```",
        ])
    if layout == "peft" and task in ("causal-lm", "text-generation"):
        return "\n".join([
            "This folder holds a LoRA adapter; peft loads its base model (`base_model_name_or_path` in "
            "`adapter_config.json`) and puts the adapter on it.",
            "",
            "```python",
            "from peft import AutoPeftModelForCausalLM",
            "from transformers import AutoTokenizer, pipeline",
            f'model = AutoPeftModelForCausalLM.from_pretrained("{ref}")',
            f'tokenizer = AutoTokenizer.from_pretrained("{ref}")',
            *_TASK_EXAMPLE[task],
            "```",
        ])
    if layout == "peft" and task in _TASK_AUTO and model_type not in _FEDFLAT_MODEL_TYPES:
        auto = _TASK_AUTO[task]
        return "\n".join([
            "This folder holds a LoRA adapter and the trained head; `config.json` has the trained labels. Load the "
            "base model (`base_model_name_or_path` in `adapter_config.json`) with that config, then the adapter.",
            "",
            "```python",
            "from peft import PeftConfig, PeftModel",
            f"from transformers import AutoConfig, {auto}, AutoTokenizer, pipeline",
            f'config = AutoConfig.from_pretrained("{ref}")',
            f'base = {auto}.from_pretrained(PeftConfig.from_pretrained("{ref}").base_model_name_or_path, '
            "config=config, ignore_mismatched_sizes=True)",
            f'model = PeftModel.from_pretrained(base, "{ref}").eval()',
            f'tokenizer = AutoTokenizer.from_pretrained("{ref}")' if task != "image-classification" else
            f'processor = AutoImageProcessor.from_pretrained("{ref}")',
            *_TASK_EXAMPLE.get(task, ()),
            "```",
        ]).replace(f"{auto}, AutoTokenizer", f"{auto}, AutoImageProcessor" if task == "image-classification"
                   else f"{auto}, AutoTokenizer")
    if layout == "peft":
        return "\n".join([
            "This folder holds a LoRA adapter (and the trained head); load it on top of its base model.",
            "",
            "```python",
            "from peft import PeftModel",
            "from hf_fedflat.models import create_model",
            "",
            "base = create_model(...)  # the base architecture the adapter was trained on",
            f'model = PeftModel.from_pretrained(base, "{ref}")',
            "```",
        ])
    if model_type and model_type not in _FEDFLAT_MODEL_TYPES:
        return _transformers_snippet(ref, task, model_config or {})
    class_name, auto = _FEDFLAT_MODEL_TYPES.get(model_type, _FEDFLAT_MODEL_TYPES["hf_fedflat_classifier"])
    architecture = (model_config or {}).get("architecture")
    lines = [
        f"The model is a `{class_name}` (a `transformers.PreTrainedModel`"
        + (f" around `{architecture}`" if architecture else "") + "); importing `hf_fedflat.models` registers it "
        "with the Auto classes.",
        "",
        "```python",
        "import hf_fedflat.models  # registers the model type",
        f"from transformers import {auto}",
        f'model = {auto}.from_pretrained("{ref}")',
        "",
        "# or, from a local copy",
        "from hf_fedflat.models import load_model",
        f'model = load_model("{local}")',
        "```",
    ]
    return "\n".join(lines)


# -------------------------------------------------------------------------------------------------
# public API
# -------------------------------------------------------------------------------------------------
def build_model_card(
    args: Any,
    *,
    history: Any = (),
    algorithm: Mapping[str, Any] | None = None,
    partition: Any = None,
    model_config: Mapping[str, Any] | None = None,
    dataset_name: str | None = None,
    dataset_id: str | None = None,
    base_model: str | None = None,
    repo_id: str | None = None,
    model_name: str | None = None,
    layout: str = "hf_fedflat",
    images: Mapping[str, str] | None = None,
    task: str = "image-classification",
    license: str | None = None,
    tags: Sequence[str] = (),
    max_table_rows: int = 20,
    lora: Any = None,
    run_config: str | None = None,
    learning_check: Mapping[str, Any] | None = None,
) -> ModelCard:
    """Build the card of a federated run (nothing is read from disk except a history/partition path).

    Args:
        args: the run's ``FedTrainingArguments``, or a mapping of its fields. Only the fields this
            module names are read (never ``hub_token``).
        history: per-round records (``FederatedTrainer.history``), a ``history.json`` or a run folder.
        algorithm: ``FederatedAlgorithm.describe()`` (name, perturbation, corrections, aggregator);
            default: resolved from ``args`` and the preset registry.
        partition: a ``ClientPartition``, its ``to_dict()``, or a ``partition.json`` path.
        model_config: the model's ``config.json`` contents (architecture, classes).
        dataset_name: the dataset's name as shown (e.g. ``"digits"``); needed for ``model-index`` results.
        dataset_id: its Hub id when it has one (goes to the ``datasets`` metadata).
        base_model: the Hub id of the weights training started from, if any.
        repo_id: the Hub repository the card is for (used in the loading snippets).
        model_name: title and ``model-index`` name (default: the repo name, else ``federated-model``).
        layout: one of :data:`LAYOUTS`: how the folder is organised (decides the loading snippets).
        images: alt text -> path relative to the card, embedded in order.
        task: the run's task (``image-classification``, ``text-classification``, ``token-classification``,
            ``causal-lm``): the ``pipeline_tag`` (``causal-lm`` -> ``text-generation``), the results' task type and
            the loading snippet (Auto class, ``pipeline``).
        license: license identifier for the metadata (``--license``).
        tags: extra tags (``federated-learning``, ``hf-fedflat`` and the algorithm's name are always there).
        max_table_rows: the per-round table shows every round up to this many, else a selection
            (see :func:`select_table_rows`).
        lora: the LoRA settings when the run trained adapters (see :func:`lora_settings`: a ``LoraConfig``,
            ``adapter_config.json``'s mapping or a run config).
        run_config: the name of the file beside the card that reruns the run (``run_config.yaml``), when there is
            one; the "Reproduce" section points to it.
        learning_check: :func:`hf_fedflat.federation.outcome.learning_check` of the run; a model that did not
            learn says so in bold in the introduction.

    The metrics are those the history records (every ``eval_*`` key), "best" by the task's primary metric
    (:func:`primary_metric`); a column or plot only for what was recorded.

    Returns:
        A ``huggingface_hub.ModelCard`` (``card.save(path)`` writes it; ``ModelCard.load`` reads it back).

    Raises:
        ValueError: For an unknown ``layout`` or ``max_table_rows < 4``.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout: must be one of {LAYOUTS}, got {layout!r}.")
    if int(max_table_rows) < 4:
        raise ValueError(f"max_table_rows: must be >= 4 (first, best, last and one more), got {max_table_rows}.")
    from ..plots import load_history

    records = load_history(history) if history is not None else []
    info = _algorithm_description(args, algorithm)
    partition = _partition_object(partition)
    final = _final_metrics(records, task)
    metric = primary_metric(records, task)
    lora = lora_settings(lora)
    algorithm_name = str(info.get("name") or "federated")
    preset_name = str(_get(args, "fed_algorithm") or algorithm_name)  # names and tags hold no spaces: the preset's
    architecture = (model_config or {}).get("architecture") or ((model_config or {}).get("architectures") or [None])[0]
    name = model_name or (repo_id.split("/")[-1] if repo_id else
                          "-".join(str(p) for p in (dataset_name, architecture, preset_name) if p))

    all_tags = ["federated-learning", "hf-fedflat", preset_name]
    for part in _part_names(info):
        if part not in ("none", "mean") and part not in all_tags:
            all_tags.append(part)
    all_tags += [t for t in tags if t not in all_tags]
    if layout == "timm" and "timm" not in all_tags:
        all_tags.append("timm")
    finals = {key.removeprefix("final_"): value for key, value in final.items()
              if key.startswith("final_eval_") and not lower_is_better(key) or key == f"final_{metric}"}
    eval_results = None
    if dataset_name and finals:
        eval_results = [EvalResult(
            task_type=pipeline_tag(task), dataset_type=dataset_id or dataset_name, dataset_name=dataset_name,
            dataset_split="test", metric_type=key.removeprefix("eval_"),
            metric_name=f"final {key.removeprefix('eval_').replace('_', ' ')}", metric_value=round(value, 6),
        ) for key, value in finals.items()]
    library = {"timm": "timm", "peft": "peft"}.get(layout, "transformers")
    data = ModelCardData(
        library_name=library, tags=all_tags, datasets=[dataset_id] if dataset_id else None,
        metrics=[key.removeprefix("eval_") for key in finals] or None, base_model=base_model,
        license=license, model_name=name, eval_results=eval_results, pipeline_tag=pipeline_tag(task),
    )

    dataset_text = f" on {dataset_name}" if dataset_name else ""
    num_clients, per_round, rounds = _get(args, "num_clients"), _clients_per_round(args), _get(args, "num_rounds")
    intro = (f"This model was trained with federated learning{dataset_text} using **{algorithm_name}**"
             + (f" ({info['description'].rstrip('.')})" if info.get("description") else "")
             + f" with `hf_fedflat`: {num_clients} clients, {per_round} per round, "
             f"{rounds} rounds.")
    if base_model:
        intro += f" Training started from [`{base_model}`](https://huggingface.co/{base_model})."
    if rounds is not None and records and len(records) < int(rounds):
        stopped = records[-1].get("run_stopped")  # (a privacy budget ended the run early)
        intro += (f" **Stopped after {len(records)} of {rounds} rounds: {stopped}.**" if stopped else
                  f" **Training in progress: {len(records)} of {rounds} rounds done.**")
    if learning_check and not learning_check.get("learned", True):  # (federation.outcome.learning_check)
        intro += f" **{learning_check['reason'].split('. Check')[0]}.**"
    sections = [f"# {name}", "", intro, "", "## Federated set-up", "",
                _table(("setting", "value"), _setup_rows(args, info, partition, records, task, lora))]

    if len(final) > 1:
        labels = {"best_round": "best round", "final_train_loss": "final train loss",
                  "mean_round_seconds": "seconds per round (mean)", "wall_seconds": "wall-clock seconds",
                  "rounds_completed": "rounds completed"}

        def label(key: str) -> str:
            if key in labels:
                return labels[key]
            kind, _, rest = key.partition("_")
            return f"{kind} {rest.removeprefix('eval_').replace('_', ' ')}"

        rows = [(label(k), f"{v:.2f}" if "seconds" in k else v) for k, v in final.items()]
        sections += ["", "## Results", "", "Evaluated on the held-out set after aggregation (the global model)"
                     + (f"; best by {metric.removeprefix('eval_')}" if metric and "best_round" in final else "") + ".",
                     "", _table(("metric", "value"), rows)]
    privacy = _privacy_rows(args, records)
    if privacy:
        sections += ["", "## Privacy", "", _table(("setting", "value"), privacy)]
    if records:
        indices, stride = select_table_rows(records, int(max_table_rows), metric)
        columns = _table_columns(records)
        rows = [[records[i].get(c, i + 1 if c == "round" else None) for c in columns] for i in indices]
        note = ("" if stride == 1 else
                f"Every {stride}th round, the first, the best and the last of {len(records)} rounds; "
                "`history.json` holds all of them.\n\n")
        sections += ["", "## Metrics per round", "", note + _table(columns, rows)]
    if images:
        sections += ["", "## Plots", ""]
        for alt, path in images.items():
            sections += [f"![{alt}]({Path(path).as_posix()})", ""]
        sections.pop()
    sections += ["", "## How to load", "", _loading_section(layout, repo_id, model_config, task)]
    if run_config:
        reproduce = (f"`{run_config}` beside this card holds the run's complete configuration (paths as they were on "
                     "the machine that trained it: change `dataset_path`, `data_dir` or `model_name_or_path` where "
                     "yours differ). With `hf_fedflat` installed:\n\n"
                     f"```bash\nhf-fedflat train --config {run_config} --output_dir my_rerun\n```\n\n"
                     "`federated_config.json` records the algorithm and its hyperparameters, the optimizer, the "
                     "partition, the model and the dataset.")
    else:
        reproduce = ("This run was not started from `hf-fedflat train`, so no `run_config.yaml` was written; "
                     "`federated_config.json` records the algorithm and its hyperparameters, the optimizer, the "
                     "partition, the model and the dataset, and the set-up above lists the same.")
    sections += ["", "## Reproduce", "", reproduce]
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(sections) + "\n")


def _metric_panels(history: Sequence[Mapping[str, Any]]) -> dict[str, list[str]]:
    """The curves' panels, only those with data: losses, perplexities, and the other (higher-is-better) metrics."""
    keys = (["train_loss"] if any(_number(r.get("train_loss")) is not None for r in history) else [])
    keys += history_metrics(history)
    panels: dict[str, list[str]] = {"loss": [], "perplexity": [], "score": []}
    for key in keys:
        panels["perplexity" if "perplexity" in key else "loss" if "loss" in key else "score"].append(key)
    return {title: names for title, names in panels.items() if names}


def plot_metrics(history: Sequence[Mapping[str, Any]], path: str | os.PathLike) -> Path | None:
    """Draw the metrics the history records per round into ``path`` (a PNG; one panel per kind of metric, see
    :func:`_metric_panels`); None, and nothing written, when the history records none."""
    from ..io import atomic_savefig
    from ..plots import metric_series

    panels = _metric_panels(history)
    if not panels:
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(4.5 * len(panels) + 1.0, 4.0), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (title, keys) in zip(axes, panels.items()):
        for key in keys:
            rounds, values = metric_series(history, key)
            ax.plot(rounds, values, label=key, marker="o" if len(rounds) <= 30 else None, markersize=3)
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(title)
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=8)
    return atomic_savefig(fig, Path(path))


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def write_model_card(
    final_model_dir: str | os.PathLike,
    args: Any,
    *,
    history: Any = None,
    partition: Any = None,
    algorithm: Mapping[str, Any] | None = None,
    output_dir: str | os.PathLike | None = None,
    layout: str | None = None,
    plots: bool = True,
    **card_kwargs: Any,
) -> Path:
    """Write ``README.md`` (and the two PNGs it embeds) into a saved model folder.

    Args:
        final_model_dir: the folder ``FederatedTrainer.save_model`` wrote (``<output_dir>/final_model``).
        args: ``FedTrainingArguments`` or a mapping of its fields.
        history: records or a path; default ``<output_dir>/history.json`` when it exists.
        partition: ``ClientPartition``/dict/path; default ``<output_dir>/partition.json`` when it exists.
        algorithm: ``describe()`` of the algorithm; default: ``federated_config.json``'s ``algorithm``.
        output_dir: the run's folder (default: the parent of ``final_model_dir``).
        layout: see :data:`LAYOUTS`; default: detected from the folder's files.
        plots: copy the partition heatmap (``<output_dir>/partition_heatmap.png``, drawn from the
            partition when missing) and draw ``training_curves.png`` next to the card.
        **card_kwargs: passed to :func:`build_model_card` (``dataset_name``, ``repo_id``, ...).

    Returns:
        The path of the written ``README.md`` (written atomically).
    """
    folder = Path(final_model_dir)
    folder.mkdir(parents=True, exist_ok=True)
    run_dir = Path(output_dir) if output_dir is not None else folder.parent
    if history is None and (run_dir / "history.json").is_file():
        history = run_dir / "history.json"
    if partition is None and (run_dir / "partition.json").is_file():
        partition = run_dir / "partition.json"
    if algorithm is None:
        for candidate in (folder / "federated_config.json", folder / FEDFLAT_SUBFOLDER / "federated_config.json"):
            if candidate.is_file():
                algorithm = json.loads(candidate.read_text()).get("algorithm")
                break
    if "model_config" not in card_kwargs:
        for candidate in (folder / "config.json", folder / FEDFLAT_SUBFOLDER / "config.json"):
            if candidate.is_file():
                card_kwargs["model_config"] = json.loads(candidate.read_text())
                if card_kwargs["model_config"].get("model_type"):
                    break
    from ..plots import load_history

    records = load_history(history) if history is not None else []
    partition = _partition_object(partition)
    images = dict(card_kwargs.pop("images", None) or {})
    if plots:
        heatmap = run_dir / PARTITION_IMAGE
        if heatmap.is_file() and heatmap.resolve() != (folder / PARTITION_IMAGE).resolve():
            _unlink(folder / PARTITION_IMAGE)  # never write through a hard link
            shutil.copyfile(heatmap, folder / PARTITION_IMAGE)
        elif not (folder / PARTITION_IMAGE).is_file() and partition is not None:
            from ..data import plot_partition_heatmap

            plot_partition_heatmap(partition, folder / PARTITION_IMAGE)
        if (folder / PARTITION_IMAGE).is_file() and card_kwargs.get("task") in (None, *_CLASSIFICATION_TASKS):
            images.setdefault("Label distribution across clients", PARTITION_IMAGE)
        _unlink(folder / CURVES_IMAGE)
        if plot_metrics(records, folder / CURVES_IMAGE) is not None:
            images.setdefault("Metrics per round", CURVES_IMAGE)
    layout = layout or detect_layout(folder)
    adapter_config = folder / "adapter_config.json"
    if "lora" not in card_kwargs and adapter_config.is_file():
        card_kwargs["lora"] = {**json.loads(adapter_config.read_text()), "save": "adapter"}
    if "lora" not in card_kwargs and (folder / RUN_CONFIG).is_file():
        import yaml

        card_kwargs["lora"] = yaml.safe_load((folder / RUN_CONFIG).read_text())
    if "run_config" not in card_kwargs:
        card_kwargs["run_config"] = RUN_CONFIG if (folder / RUN_CONFIG).is_file() else None
    card = build_model_card(
        args, history=records, algorithm=algorithm, partition=partition, layout=layout, images=images, **card_kwargs,
    )
    path = folder / CARD_NAME
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{CARD_NAME}.", suffix=".tmp")
    os.close(fd)
    try:
        Path(tmp).write_text(str(card), encoding="utf-8")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def card_inputs_from_trainer(trainer) -> dict[str, Any]:
    """The explicit inputs of :func:`build_model_card` taken from a ``FederatedTrainer``.

    Extra card settings the trainer cannot know (dataset name and Hub id, base model, license,
    tags) are read from ``trainer.model_card_kwargs`` when that attribute is set (the CLI sets it).
    """
    model_config = None
    config = getattr(trainer.model, "config", None)
    if config is not None and hasattr(config, "to_dict"):
        model_config = config.to_dict()
    inputs = {
        "args": trainer.args,
        "history": list(trainer.history),
        "algorithm": trainer.algorithm.describe(),
        "partition": trainer.partition,
        "model_config": model_config,
        "learning_check": getattr(trainer, "learning_check", None),
    }
    peft_config = getattr(trainer.model, "peft_config", None)
    if isinstance(peft_config, Mapping) and peft_config:
        inputs["lora"] = {**next(iter(peft_config.values())).to_dict(), "save": getattr(trainer, "lora_save", None)}
    inputs.update(dict(getattr(trainer, "model_card_kwargs", None) or {}))
    return inputs


def model_card_from_trainer(trainer, **overrides: Any) -> ModelCard:
    """:func:`build_model_card` for a ``FederatedTrainer`` (see :func:`card_inputs_from_trainer`)."""
    inputs = card_inputs_from_trainer(trainer)
    inputs.update(overrides)
    args = inputs.pop("args")
    return build_model_card(args, **inputs)


def write_model_card_for_trainer(trainer, final_model_dir: str | os.PathLike | None = None, **overrides: Any) -> Path:
    """:func:`write_model_card` for a ``FederatedTrainer`` (default folder ``<output_dir>/final_model``)."""
    inputs = card_inputs_from_trainer(trainer)
    inputs.update(overrides)
    args = inputs.pop("args")
    folder = final_model_dir if final_model_dir is not None else os.path.join(args.output_dir, "final_model")
    return write_model_card(folder, args, output_dir=inputs.pop("output_dir", args.output_dir), **inputs)

