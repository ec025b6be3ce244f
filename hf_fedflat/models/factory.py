"""The one entry point for models: ``create_model(name, num_classes, ...)`` and ``load_model(path)``.

Every model it returns is a :class:`~hf_fedflat.models.modeling.FedFlatImageClassifier`, which the
``transformers.Trainer`` trains directly (``forward(pixel_values, labels=None)`` returns ``loss``
and ``logits``) and which saves/loads as ``config.json`` + ``model.safetensors``.
"""

from __future__ import annotations

import json
import os
from typing import Any

from .backbones import build_backbone, check_model_name
from .modeling import FedFlatClassifierConfig, FedFlatImageClassifier

__all__ = ["create_model", "load_model"]


def create_model(
    name: str,
    num_classes: int,
    *,
    in_chans: int = 3,
    image_size: int = 32,
    pretrained: bool = False,
    pretrained_path: str | os.PathLike | None = None,
    **model_kwargs: Any,
) -> FedFlatImageClassifier:
    """Create a Trainer-ready image classifier by name.

    Args:
        name: ``"small_cnn"`` (FedAvg/FedGAM CNN), ``"resnet18_gn"`` (timm ResNet-18 with
            GroupNorm(2); options ``gn_groups``, ``cifar_stem``) or any timm model name (e.g.
            ``"vit_tiny_patch16_224"``), created with ``timm.create_model``.
        num_classes: Number of output classes.
        in_chans: Number of input channels (1 for grey-scale images).
        image_size: Square input resolution; sizes the ``small_cnn`` classifier and is passed as
            ``img_size`` to timm models that take it (ViTs).
        pretrained: Load the published timm weights (requires Hub access).
        pretrained_path: Load backbone weights from this local file instead (``.safetensors`` or a
            torch state dict in timm's key layout); implies ``pretrained``. A head whose size differs
            from ``num_classes`` is replaced by a fresh one.
        **model_kwargs: Architecture options (e.g. ``patch_size=8, depth=2, embed_dim=64,
            num_heads=2`` for a tiny ViT). They are stored in ``config.model_kwargs``, so they must be
            JSON-serialisable.

    Returns:
        A :class:`FedFlatImageClassifier` in training mode. Its parameter order and, for a given
        ``torch.manual_seed``, its initial weights are deterministic.

    Raises:
        ValueError: Unknown ``name`` (the message lists the available names) or invalid options.
        TypeError: ``model_kwargs`` that cannot be stored in ``config.json``.
    """
    check_model_name(name)
    try:
        json.dumps(model_kwargs)
    except TypeError as err:
        raise TypeError(
            f"model_kwargs must be JSON-serialisable to be saved in config.json: {err}"
        ) from err
    config = FedFlatClassifierConfig(
        architecture=name,
        num_classes=int(num_classes),
        in_chans=int(in_chans),
        image_size=int(image_size),
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


def load_model(path: str | os.PathLike, **kwargs: Any) -> FedFlatImageClassifier:
    """Load a model saved with ``save_pretrained`` (or a Trainer checkpoint) from a local directory.

    Args:
        path: Directory with ``config.json`` and ``model.safetensors``.
        **kwargs: Passed to ``FedFlatImageClassifier.from_pretrained`` (e.g. ``dtype``).

    Returns:
        The model, in eval mode (as ``from_pretrained`` leaves it), with bit-identical weights.

    Raises:
        FileNotFoundError: If ``path`` is not a directory (no Hub look-up is attempted).
    """
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{os.fspath(path)!r} is not a directory saved with save_pretrained")
    kwargs.setdefault("local_files_only", True)
    return FedFlatImageClassifier.from_pretrained(os.fspath(path), **kwargs)
