"""Any ``transformers`` model by Hub id or local folder: ``--model_name_or_path`` + ``--task``.

The task picks the Auto class, the peft task type and the card's ``pipeline_tag``:

=========================  =====================================  ===========  ======================
task                       Auto class                             peft         pipeline_tag
=========================  =====================================  ===========  ======================
``image-classification``   ``AutoModelForImageClassification``    (head kept)  image-classification
``text-classification``    ``AutoModelForSequenceClassification``  ``SEQ_CLS``  text-classification
``token-classification``   ``AutoModelForTokenClassification``     ``TOKEN_CLS`` token-classification
``causal-lm``              ``AutoModelForCausalLM``                ``CAUSAL_LM`` text-generation
=========================  =====================================  ===========  ======================

Without ``--task`` it is read from ``config.json``'s ``architectures`` (``BertForSequenceClassification``
-> text-classification, ``GPT2LMHeadModel`` -> causal-lm, a timm ``config.json`` -> image-classification);
a base checkpoint (``BertForMaskedLM``, ``BertModel``) says nothing about the task, and then the data's task
decides (a labelled text dataset: text-classification) or the user passes ``--task``.

The tokenizer (text tasks) or image processor (image task) loads from the same path
(:func:`load_processing_class`); it preprocesses the data, is given to the Trainer as ``processing_class``
and is saved in ``final_model/``. ``num_labels``, ``id2label`` and ``label2id`` come from the dataset's
``ClassLabel`` names (:func:`build_auto_model`); a pretrained head of another size is replaced by a new one.

>>> from hf_fedflat.models.arguments import ModelArguments
>>> args = ModelArguments(model_name_or_path="path/to/tiny-bert", task="text-classification")
>>> tokenizer = load_processing_class(args)
>>> model = build_auto_model(args, label_names=["neg", "pos"], processing_class=tokenizer)
"""

from __future__ import annotations

import json
import os
import weakref
from collections.abc import Sequence
from typing import Any
from ..field_checks import ConfigError

__all__ = [
    "AUTO_CLASS_NAMES",
    "PEFT_TASK_TYPES",
    "PIPELINE_TAGS",
    "TASKS",
    "build_auto_model",
    "is_auto_model",
    "load_processing_class",
    "newly_initialised_modules",
    "resolve_task",
    "task_from_architectures",
]

TASKS = ("image-classification", "text-classification", "token-classification", "causal-lm")

AUTO_CLASS_NAMES: dict[str, str] = {
    "image-classification": "AutoModelForImageClassification",
    "text-classification": "AutoModelForSequenceClassification",
    "token-classification": "AutoModelForTokenClassification",
    "causal-lm": "AutoModelForCausalLM",
}
"""Task -> the ``transformers`` Auto class that loads (and reloads) its model."""

PEFT_TASK_TYPES: dict[str, str | None] = {
    "image-classification": None,  # no peft task type: the head goes to modules_to_save
    "text-classification": "SEQ_CLS",
    "token-classification": "TOKEN_CLS",
    "causal-lm": "CAUSAL_LM",
}
"""Task -> ``peft.TaskType`` name given to ``LoraConfig(task_type=...)``."""

PIPELINE_TAGS: dict[str, str] = {
    "image-classification": "image-classification",
    "text-classification": "text-classification",
    "token-classification": "token-classification",
    "causal-lm": "text-generation",
}
"""Task -> the Hub ``pipeline_tag`` (and the ``transformers.pipeline`` task name)."""

_SUFFIXES = (
    ("ForSequenceClassification", "text-classification"),
    ("ForTokenClassification", "token-classification"),
    ("ForCausalLM", "causal-lm"),
    ("LMHeadModel", "causal-lm"),
    ("ForImageClassification", "image-classification"),
)
_DTYPES = ("float32", "bfloat16", "float16", "auto")


def check_task(task: str | None) -> None:
    """``ValueError`` naming the choices when ``task`` is not one of :data:`TASKS` (None passes)."""
    if task is not None and task not in TASKS:
        raise ConfigError(f"task: must be one of {', '.join(TASKS)}, got {task!r}.")


def task_from_architectures(config: Any) -> str | None:
    """The task a ``config.json`` (a dict or a ``PreTrainedConfig``) was saved for, or None when it does not say.

    A timm ``config.json`` (``architecture`` + ``pretrained_cfg``, model type ``timm_wrapper``) is an image
    classifier; otherwise the first entry of ``architectures`` with a known suffix decides.
    """
    data = config if isinstance(config, dict) else config.to_dict()
    if data.get("model_type") == "timm_wrapper" or ("pretrained_cfg" in data and "architecture" in data):
        return "image-classification"
    for architecture in data.get("architectures") or ():
        for suffix, task in _SUFFIXES:
            if str(architecture).endswith(suffix):
                return task
    return None


def _read_config(path: str) -> dict[str, Any]:
    """``config.json`` of a local folder, or through ``AutoConfig`` (Hub id, cache)."""
    local = os.path.join(path, "config.json")
    if os.path.isfile(local):
        with open(local, encoding="utf-8") as f:
            return json.load(f)
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(path).to_dict()
    except (OSError, ValueError) as error:
        raise OSError(
            f"model_name_or_path: cannot read the config of {path!r} ({error}). Give a local folder saved with "
            "save_pretrained, or a Hub id reachable from here (HF_HUB_OFFLINE=1 allows only cached ones)."
        ) from error


def resolve_task(model_args: Any, data_task: str | None = None) -> str:
    """The run's task: ``model_args.task`` when given, else from the config's ``architectures``, else ``data_task``.

    Args:
        model_args: :class:`~hf_fedflat.models.arguments.ModelArguments` with ``model_name_or_path`` set.
        data_task: what the dataset is for (``FederatedData.task``), used when the checkpoint does not say
            (a base or masked-LM checkpoint such as ``bert-base-uncased``).

    Raises:
        ValueError: Neither says; the message lists the tasks and the config's architectures.
    """
    check_task(model_args.task)
    if model_args.task:
        return model_args.task
    config = _read_config(model_args.model_name_or_path)
    task = task_from_architectures(config)
    if task is None and data_task in TASKS:
        task = data_task
    if task is None:
        raise ConfigError(
            f"task: cannot tell the task of {model_args.model_name_or_path!r} from its architectures "
            f"{config.get('architectures')}; pass --task with one of {', '.join(TASKS)}."
        )
    return task


def load_processing_class(model_args: Any, task: str | None = None):
    """The tokenizer (text tasks) or image processor (image task) saved with the model, from the same path.

    A tokenizer without a padding token gets its end-of-sequence token as one (GPT-2, Llama), since batches
    are padded; the model's ``pad_token_id`` is set to match in :func:`build_auto_model`.

    Returns:
        ``AutoTokenizer.from_pretrained(path)`` / ``AutoImageProcessor.from_pretrained(path)``.

    Raises:
        OSError: Nothing to load at that path (the message says what was looked for).
    """
    task = task or resolve_task(model_args)
    path = model_args.model_name_or_path
    if task == "image-classification":
        from transformers import AutoImageProcessor

        try:
            return AutoImageProcessor.from_pretrained(path)
        except (OSError, ValueError) as error:
            raise OSError(f"model_name_or_path: no image processor (preprocessor_config.json) at {path!r}: {error}") from error
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as error:
        raise OSError(
            f"model_name_or_path: no tokenizer at {path!r} ({error}); save one there with tokenizer.save_pretrained."
        ) from error
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _dtype(name: str):
    import torch

    if name not in _DTYPES:
        raise ConfigError(f"model_dtype: must be one of {', '.join(_DTYPES)}, got {name!r}.")
    return name if name == "auto" else getattr(torch, name)


def build_auto_model(
    model_args: Any,
    *,
    task: str | None = None,
    label_names: Sequence[str] | None = None,
    num_labels: int | None = None,
    processing_class: Any = None,
):
    """Load ``model_args.model_name_or_path`` with the Auto class of the task.

    Args:
        model_args: :class:`~hf_fedflat.models.arguments.ModelArguments` (``model_name_or_path``, ``task``,
            ``model_dtype``).
        task: the run's task (default :func:`resolve_task`).
        label_names: class names in label-id order (a ``ClassLabel``'s ``names``): they become ``id2label``
            / ``label2id`` and set ``num_labels``. Classification tasks only.
        num_labels: number of classes when there are no names (``id2label`` is then ``LABEL_<i>``).
        processing_class: the tokenizer; its ``pad_token_id`` is written into the config when the config
            has none (needed by GPT-style sequence classifiers to find the last token).

    Returns:
        The model in training mode, weights in ``model_args.model_dtype`` (float32 by default). A head whose
        size differs from the labels is newly initialised (``ignore_mismatched_sizes``).
    """
    import transformers

    task = task or resolve_task(model_args)
    check_task(task)
    path = model_args.model_name_or_path
    config_kwargs: dict[str, Any] = {}
    if label_names is not None:
        if task == "causal-lm":
            raise ConfigError("label_names: a causal LM has no class labels (the tokens are its labels).")
        names = [str(n) for n in label_names]
        if len(set(names)) != len(names):
            raise ConfigError(f"label_names: must be distinct, got {names}.")
        config_kwargs = {"num_labels": len(names), "id2label": dict(enumerate(names)),
                         "label2id": {name: i for i, name in enumerate(names)}}
    elif num_labels is not None and task != "causal-lm":
        config_kwargs = {"num_labels": int(num_labels),
                         "id2label": {i: f"LABEL_{i}" for i in range(int(num_labels))},
                         "label2id": {f"LABEL_{i}": i for i in range(int(num_labels))}}
    config = transformers.AutoConfig.from_pretrained(path, **config_kwargs)
    pad_id = getattr(processing_class, "pad_token_id", None)
    if pad_id is not None and getattr(config, "pad_token_id", None) is None:
        config.pad_token_id = pad_id
    auto_class = getattr(transformers, AUTO_CLASS_NAMES[task])
    kwargs: dict[str, Any] = {"config": config, "dtype": _dtype(getattr(model_args, "model_dtype", "float32"))}
    if task != "causal-lm":
        kwargs["ignore_mismatched_sizes"] = True
    model, loading = auto_class.from_pretrained(path, output_loading_info=True, **kwargs)
    # the layers the checkpoint lacks or holds in another shape (a new head, BERT's pooler under an MLM checkpoint):
    # initialised at random here, so LoRA must train and save them (hf_fedflat.models.lora.apply_lora)
    keys = list(loading.get("missing_keys") or ()) + [k[0] if isinstance(k, tuple) else k
                                                       for k in loading.get("mismatched_keys") or ()]
    _NEW_MODULES[model] = tuple(dict.fromkeys(key.rsplit(".", 1)[0] for key in keys if "." in key))
    model.train()
    return model


_NEW_MODULES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def newly_initialised_modules(model: Any) -> tuple[str, ...]:
    """Names of the modules of a :func:`build_auto_model` model that its checkpoint did not hold (missing keys, or a
    head of another size): initialised at random at every load. Empty for any other model."""
    try:
        return _NEW_MODULES.get(model, ())
    except TypeError:  # not weak-referenceable
        return ()


def is_auto_model(model: Any) -> bool:
    """Whether ``model`` is a ``transformers`` model (not one of hf_fedflat's own classes)."""
    from transformers import PreTrainedModel

    return isinstance(model, PreTrainedModel) and not type(model).__module__.startswith("hf_fedflat.")
