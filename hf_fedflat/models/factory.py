"""The one entry point for models: ``create_model(name, num_classes, ...)`` and ``load_model(path)``.

Image models are :class:`~hf_fedflat.models.modeling.FedFlatImageClassifier` (``forward(pixel_values,
labels=None)``); the next-character models of :mod:`hf_fedflat.models.next_char` take ``input_ids``. Both
kinds return ``loss`` and ``logits``, so the ``transformers.Trainer`` trains them directly, and both
save/load as ``config.json`` + ``model.safetensors``. ``load_model`` reads ``config.json`` to pick the
class, and reloads a LoRA adapter directory onto a base model (:mod:`hf_fedflat.models.lora`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import timm
from transformers import PreTrainedModel

from .backbones import CUSTOM_MODELS, build_backbone, check_model_name
from .modeling import FedFlatClassifierConfig, FedFlatImageClassifier
from .next_char import LEAF_VOCAB_SIZE, TEXT_MODELS
from ..field_checks import ConfigError

__all__ = ["FEDFLAT_SUBFOLDER", "available_models", "create_model", "load_model", "MODEL_CLASSES"]

FEDFLAT_SUBFOLDER = "hf_fedflat"
"""Where hf_fedflat's own ``save_pretrained`` files go in a timm-layout folder (:mod:`hf_fedflat.models.artifacts`)."""

# (in_chans, image_size) when the caller gives none: the dataset the architecture was made for.
_IMAGE_DEFAULTS: dict[str, tuple[int, int]] = {"fedgam_cnn": (1, 28)}
_DEFAULT_IMAGE = (3, 32)

MODEL_CLASSES: dict[str, type[PreTrainedModel]] = {
    FedFlatClassifierConfig.model_type: FedFlatImageClassifier,
    **{config_cls.model_type: model_cls for config_cls, model_cls in TEXT_MODELS.values()},
}
"""``config.json`` ``model_type`` -> the class ``load_model`` rebuilds."""


def available_models(include_timm: bool = False) -> list[str]:
    """List the names ``create_model`` accepts.

    Args:
        include_timm: Also list every architecture registered in timm (about 1,300 names).

    Returns:
        The image models of hf_fedflat (``small_cnn``, ``resnet18_gn``, ``fedgam_cnn``), the
        next-character models (``char_lstm``, ``char_transformer``), then the timm names if asked.
    """
    names = [*CUSTOM_MODELS, *TEXT_MODELS]
    if include_timm:
        names += [n for n in timm.list_models() if n not in names]
    return names


def _check_name(name: str) -> None:
    check_model_name(name, known=available_models())


def create_model(
    name: str,
    num_classes: int | None = None,
    *,
    in_chans: int | None = None,
    image_size: int | None = None,
    vocab_size: int | None = None,
    pretrained: bool = False,
    pretrained_path: str | os.PathLike | None = None,
    **model_kwargs: Any,
) -> PreTrainedModel:
    """Create a Trainer-ready model by name.

    Args:
        name: An image model -- ``"small_cnn"`` (FedAvg CNN), ``"fedgam_cnn"`` (the same CNN at the
            FedGAM paper's sizes, 1x28x28 input by default), ``"resnet18_gn"`` (timm ResNet-18 with
            GroupNorm(2); options ``gn_groups``, ``cifar_stem``) or any timm model name (e.g.
            ``"vit_base_patch32_224"``, ``"vit_tiny_patch16_224"``) -- or a next-character model for
            LEAF Shakespeare: ``"char_lstm"`` (LEAF's 2x256 LSTM) or ``"char_transformer"`` (a small
            causal transformer).
        num_classes: Number of output classes. Required for image models; next-character models
            default to ``vocab_size``.
        in_chans: Input channels of an image model (default 3; 1 for ``fedgam_cnn``).
        image_size: Square input resolution of an image model (default 32; 28 for ``fedgam_cnn``);
            sizes the CNN classifiers and is passed as ``img_size`` to timm models that take it (ViTs).
        vocab_size: Number of character ids of a next-character model (default 80, LEAF's vocabulary).
        pretrained: Load the published timm weights (requires Hub access).
        pretrained_path: Load weights from this local file instead (``.safetensors`` or a torch
            state dict); implies ``pretrained``. For timm models a head whose size differs from
            ``num_classes`` is replaced by a fresh one; other models load the file strictly.
        **model_kwargs: Architecture options: timm options such as ``patch_size=8, depth=2,
            embed_dim=64, num_heads=2`` for a tiny ViT (stored in ``config.model_kwargs``, so
            JSON-serialisable), or the fields of :class:`~hf_fedflat.models.next_char.CharLSTMConfig` /
            :class:`~hf_fedflat.models.next_char.CharTransformerConfig` (``hidden_size``, ``d_model``,
            ``num_layers``, ``num_heads``, ``dropout``, ...).

    Returns:
        A ``PreTrainedModel`` in training mode: a :class:`FedFlatImageClassifier` or a next-character
        model. Its parameter order and, for a given ``torch.manual_seed``, its initial weights are
        deterministic.

    Raises:
        ValueError: Unknown ``name`` (the message lists the available names), an argument that does
            not apply to the kind of model, or invalid options.
        TypeError: Image ``model_kwargs`` that cannot be stored in ``config.json``.
    """
    _check_name(name)
    if name in TEXT_MODELS:
        return _create_text_model(
            name, num_classes, in_chans=in_chans, image_size=image_size, vocab_size=vocab_size,
            pretrained=pretrained, pretrained_path=pretrained_path, **model_kwargs,
        )
    if num_classes is None:
        raise ConfigError(f"num_classes is required for image models, e.g. create_model({name!r}, num_classes=10)")
    if vocab_size is not None:
        raise ConfigError(f"vocab_size applies to next-character models only; {name!r} is an image model")
    default_chans, default_size = _IMAGE_DEFAULTS.get(name, _DEFAULT_IMAGE)
    try:
        json.dumps(model_kwargs)
    except TypeError as err:
        raise TypeError(
            f"model_kwargs must be JSON-serialisable to be saved in config.json: {err}"
        ) from err
    config = FedFlatClassifierConfig(
        architecture=name,
        num_classes=int(num_classes),
        in_chans=int(default_chans if in_chans is None else in_chans),
        image_size=int(default_size if image_size is None else image_size),
        model_kwargs=dict(model_kwargs),
    )
    backbone = build_backbone(
        name,
        num_classes=config.num_classes,
        in_chans=config.in_chans,
        image_size=config.image_size,
        pretrained=pretrained,
        pretrained_path=pretrained_path,
        **model_kwargs,
    )
    return FedFlatImageClassifier(config, backbone=backbone)


def _create_text_model(
    name: str,
    num_classes: int | None,
    *,
    in_chans: int | None,
    image_size: int | None,
    vocab_size: int | None,
    pretrained: bool,
    pretrained_path: str | os.PathLike | None,
    **model_kwargs: Any,
) -> PreTrainedModel:
    """Build a next-character model from the config fields given as keyword arguments."""
    for arg, value in (("in_chans", in_chans), ("image_size", image_size)):
        if value is not None:
            raise ConfigError(f"{arg} applies to image models only; {name!r} reads character ids (input_ids)")
    if pretrained and pretrained_path is None:
        raise ConfigError(f"pretrained: {name} has no published weights; pass pretrained_path=<local weights file>")
    config_class, model_class = TEXT_MODELS[name]
    field_types = {f.name: f.type for f in dataclasses.fields(config_class) if f.name in config_class.__annotations__}
    options = sorted(set(field_types) - {"vocab_size", "num_classes"})
    unknown = sorted(set(model_kwargs) - set(options))
    if unknown:
        raise ConfigError(f"{', '.join(unknown)}: not an option of {name}; its options are {', '.join(options)}")
    for key, value in model_kwargs.items():
        # `@strict` rejects an int for a float field (dropout=0); the intent is unambiguous.
        if field_types[key] is float and isinstance(value, int) and not isinstance(value, bool):
            model_kwargs[key] = float(value)
    config = config_class(
        vocab_size=LEAF_VOCAB_SIZE if vocab_size is None else int(vocab_size),
        num_classes=None if num_classes is None else int(num_classes),
        **model_kwargs,
    )
    model = model_class(config)
    if pretrained_path is not None:
        path = os.fspath(pretrained_path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"pretrained_path {path!r} is not a file")
        # timm's loader reads .safetensors and torch files (weights_only) and strips "module." prefixes.
        model.load_state_dict(timm.models.load_state_dict(path), strict=True)
    return model


def _verify_saved_folder(path: str) -> None:
    """The completion marker of ``path`` (or of its parent, for the ``hf_fedflat/`` subfolder of a timm-layout
    final model), when there is one: every file it lists present with its size and SHA-256."""
    from ..io import COMPLETE_MARKER, verify_complete_dir

    folders = [path]
    if os.path.basename(os.path.normpath(path)) == FEDFLAT_SUBFOLDER:
        folders.append(os.path.dirname(os.path.normpath(path)))
    for folder in folders:
        if os.path.isfile(os.path.join(folder, COMPLETE_MARKER)):
            verify_complete_dir(folder)
            return


def load_model(
    path: str | os.PathLike,
    *,
    base_model: PreTrainedModel | None = None,
    verify: bool = True,
    **kwargs: Any,
) -> PreTrainedModel:
    """Load a model saved with ``save_pretrained`` (or a Trainer checkpoint) from a local directory.

    Any model ``create_model`` makes is recognised from the ``model_type`` in ``config.json``. A
    directory holding a LoRA adapter (``adapter_config.json``, as written by
    ``save_federated_model(..., lora_save="adapter")``) is loaded onto ``base_model`` with
    ``peft.PeftModel.from_pretrained``.

    Args:
        path: Directory with ``config.json`` and ``model.safetensors``, a LoRA adapter directory, or a final model
            in timm's layout (hf_fedflat's files in its ``hf_fedflat/`` subfolder).
        base_model: The model the adapter was trained on (same architecture and frozen weights, e.g.
            ``create_model(...)`` with the same pretrained weights); only for adapter directories.
        verify: Check the folder against the completion marker hf_fedflat writes last into a saved folder
            (``hf_fedflat_complete.json``: every file's size and SHA-256; for ``<final_model>/hf_fedflat`` the
            marker of ``<final_model>``) when it has one; a folder without one (a plain ``save_pretrained``, a Hub
            download) loads as it is.
        **kwargs: Passed to ``from_pretrained`` (e.g. ``dtype``).

    Returns:
        The model, in eval mode (as ``from_pretrained`` leaves it), with bit-identical weights; for an
        adapter directory, a ``peft.PeftModel`` wrapping ``base_model``.

    Raises:
        FileNotFoundError: If ``path`` is not a directory (no Hub look-up is attempted) or holds no
            ``config.json``.
        ValueError: For an adapter directory without ``base_model``, or an unknown ``model_type``.
        hf_fedflat.io.IncompleteSaveError: A file missing, changed or truncated since the save (a flipped byte,
            another run's weights copied in), naming the file.
    """
    path = os.fspath(path)
    if not os.path.lexists(path):  # a final save killed while it replaced the folder: the previous one, put back
        from ..io import restore_interrupted_dir

        restore_interrupted_dir(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path!r} is not a directory saved with save_pretrained")
    if verify:
        _verify_saved_folder(path)
    if os.path.isfile(os.path.join(path, "adapter_config.json")):
        if base_model is None:
            raise ConfigError(
                f"base_model: {path!r} holds a LoRA adapter, not a full model; pass the model it was trained on, "
                "e.g. load_model(path, base_model=create_model(...)), or save with lora_save='merged'"
            )
        from peft import PeftModel

        from .lora import quiet_peft

        with quiet_peft():
            return PeftModel.from_pretrained(base_model, path, **kwargs)
    if base_model is not None:
        raise ConfigError(f"base_model: {path!r} holds a full model, not a LoRA adapter; leave base_model unset")
    if os.path.isfile(os.path.join(path, FEDFLAT_SUBFOLDER, "config.json")):
        path = os.path.join(path, FEDFLAT_SUBFOLDER)  # a timm-layout final model: hf_fedflat's files are in here
    config_file = os.path.join(path, "config.json")
    if not os.path.isfile(config_file):
        raise FileNotFoundError(f"{path!r} has no config.json: it was not saved with save_pretrained")
    with open(config_file, encoding="utf-8") as f:
        model_type = json.load(f).get("model_type")
    if model_type not in MODEL_CLASSES:
        raise ConfigError(
            f"{config_file}: model_type {model_type!r} is not an hf_fedflat model ({', '.join(MODEL_CLASSES)})"
        )
    kwargs.setdefault("local_files_only", True)
    return MODEL_CLASSES[model_type].from_pretrained(path, **kwargs)
