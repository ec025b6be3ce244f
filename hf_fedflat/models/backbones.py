"""Plain PyTorch backbones (images -> logits) by name: the registry behind ``create_model``.

Three kinds of names are understood:

* ``"small_cnn"``: :class:`~hf_fedflat.models.small_cnn.SmallCNN`, the FedAvg/FedGAM CNN.
* ``"fedgam_cnn"``: the same CNN under the name the FedGAM recipes use, pinned to the paper's
  layer sizes (conv 5x5 32 and 64 channels, FC 512); the factory gives it MNIST's 1x28x28 input.
* ``"resnet18_gn"``: timm ``resnet18`` with every BatchNorm replaced by GroupNorm (2 groups by
  default), the ResNet-18-GN of the federated CIFAR papers, optionally with a CIFAR stem.
* ``"logistic"``: multinomial logistic regression over the flattened input (``in_chans * image_size**2``
  features; the Synthetic(alpha, beta) model of LEAF / FedProx).
* any other timm model name (``timm.list_models()``), built by ``timm.create_model``.

The modules returned here know nothing about Hugging Face; :mod:`hf_fedflat.models.modeling`
wraps them into a ``transformers.PreTrainedModel``. Everything a backbone needs must be
expressible by ``(architecture, num_classes, in_chans, image_size, model_kwargs)`` so that the
wrapper can rebuild it from ``config.json``.
"""

from __future__ import annotations

import difflib
import logging
import os
from collections.abc import Callable
from functools import partial
from typing import Any

import timm
import torch
from torch import nn

from ..field_checks import ConfigError, fail
from .norms import batchnorm_modules
from .small_cnn import SmallCNN

__all__ = ["CUSTOM_MODELS", "check_model_name", "build_backbone"]

logger = logging.getLogger(__name__)

_BN_STAT_SUFFIXES = ("running_mean", "running_var", "num_batches_tracked")


# --------------------------------------------------------------------------------------------
# local weight files
# --------------------------------------------------------------------------------------------
def _checkpoint_shapes(path: str) -> dict[str, tuple[int, ...]]:
    """Read tensor shapes from a weights file without keeping the tensors in memory.

    Args:
        path: A ``.safetensors`` file or a ``torch.save``-d state dict (``.pth``/``.bin``/...).

    Returns:
        Mapping from key to shape (keys as stored; a wrapping ``{"state_dict": ...}`` is unwrapped).
    """
    if path.endswith(".safetensors"):
        from safetensors import safe_open

        with safe_open(path, framework="pt") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    sd = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    for key in ("state_dict", "model", "state_dict_ema"):
        if isinstance(sd, dict) and isinstance(sd.get(key), dict):
            sd = sd[key]
            break
    return {k: tuple(v.shape) for k, v in sd.items() if isinstance(v, torch.Tensor)}


def _local_weights_overlay(path: str, pretrained_cfg: dict[str, Any], num_classes: int) -> dict[str, Any]:
    """Build the timm ``pretrained_cfg_overlay`` that loads weights from a local file.

    timm decides how to adapt a checkpoint from the model's *registered* pretrained config, not from
    the file: it drops the classifier whenever ``num_classes`` differs from the registered one (1000
    for ImageNet models), even when the local file has a head of the right size, and it assumes
    3-channel input convolutions. We read the head size and the input channels from the file and
    put them into the overlay, so a matching head is loaded (a non-matching one is replaced by a
    fresh head) and the input convolution is adapted only when its channels really differ.

    Args:
        path: Local weights file.
        pretrained_cfg: The model's timm pretrained config (``classifier``, ``first_conv``,
            ``input_size`` are read).
        num_classes: The number of classes of the model being built.

    Returns:
        ``dict(file=path)`` plus ``num_classes`` and ``input_size`` when found in the file.

    Raises:
        FileNotFoundError: If ``path`` is not a file.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"pretrained_path {path!r} is not a file")
    overlay: dict[str, Any] = {"file": os.fspath(path)}
    shapes = _checkpoint_shapes(path)

    def _names(value: str | tuple[str, ...] | None) -> tuple[str, ...]:
        return (value,) if isinstance(value, str) else tuple(value or ())

    for name in _names(pretrained_cfg.get("classifier")):
        shape = shapes.get(f"{name}.weight")
        if shape:
            overlay["num_classes"] = int(shape[0])
            if shape[0] != num_classes:
                logger.warning(
                    "Checkpoint %s has a %d-class head %r; the model has %d classes, so the head is "
                    "freshly initialised.", path, shape[0], name, num_classes,
                )
            break
    input_size = tuple(pretrained_cfg.get("input_size") or (3, 224, 224))
    for name in _names(pretrained_cfg.get("first_conv")):
        shape = shapes.get(f"{name}.weight")
        if shape and len(shape) == 4:
            overlay["input_size"] = (int(shape[1]), *input_size[1:])
            break
    return overlay


# --------------------------------------------------------------------------------------------
# builders
# --------------------------------------------------------------------------------------------
def _build_small_cnn(
    *,
    num_classes: int,
    in_chans: int,
    image_size: int,
    pretrained: bool,
    pretrained_path: str | None,
    **kwargs: Any,
) -> nn.Module:
    if pretrained and pretrained_path is None:
        raise ConfigError("small_cnn has no published pretrained weights: pass pretrained_path=<local file>")
    model = SmallCNN(num_classes=num_classes, in_chans=in_chans, image_size=image_size, **kwargs)
    if pretrained_path is not None:
        # timm's loader reads .safetensors and torch files alike and strips "module." prefixes.
        state_dict = timm.models.load_state_dict(pretrained_path)
        model.load_state_dict(state_dict, strict=True)
    return model


def _build_fedgam_cnn(
    *,
    num_classes: int,
    in_chans: int,
    image_size: int,
    pretrained: bool,
    pretrained_path: str | None,
    **kwargs: Any,
) -> nn.Module:
    """The CNN of FedGAM's MNIST / FashionMNIST experiments (Xu et al., Mathematics 2024).

    FedGAM trains the CNN of McMahan et al. (2017): two 5x5 convolutions with 32 and 64 channels,
    each followed by ReLU and 2x2 max-pooling, a 512-unit fully connected layer and the output layer
    (1,663,370 parameters on 28x28 digits). The layer sizes are fixed by the name; only ``dropout``
    may be set. Use ``small_cnn`` for other sizes.
    """
    fixed = sorted(set(kwargs) - {"dropout"})
    if fixed:
        raise ConfigError(
            f"fedgam_cnn fixes the paper's layer sizes; {', '.join(fixed)} cannot be set. Use "
            "create_model('small_cnn', ...) to change them."
        )
    return _build_small_cnn(
        num_classes=num_classes, in_chans=in_chans, image_size=image_size, pretrained=pretrained,
        pretrained_path=pretrained_path, conv_channels=(32, 64), hidden_dim=512, kernel_size=5, **kwargs,
    )


def _create_timm(
    name: str,
    *,
    num_classes: int,
    in_chans: int,
    image_size: int | None,
    pretrained: bool,
    pretrained_path: str | None,
    **kwargs: Any,
) -> nn.Module:
    """``timm.create_model`` with local weights and ``img_size`` passed only where accepted."""
    if "img_size" in kwargs:
        raise ConfigError("pass the input resolution as image_size=..., not img_size in model_kwargs")
    if pretrained_path is not None:
        cfg = {k: timm.models.get_pretrained_cfg_value(name, k) for k in ("classifier", "first_conv", "input_size")}
        kwargs["pretrained_cfg_overlay"] = _local_weights_overlay(pretrained_path, cfg, num_classes)
        pretrained = True
    kwargs.update(pretrained=pretrained, num_classes=num_classes, in_chans=in_chans)
    if image_size is None:
        return timm.create_model(name, **kwargs)
    try:
        # ViTs, Swin, ... need the resolution at construction (position embeddings); with
        # pretrained weights timm resamples the position embeddings to it.
        return timm.create_model(name, img_size=image_size, **kwargs)
    except TypeError as err:
        # CNNs (ResNet, ConvNeXt, ...) have no img_size argument. The constructor fails while
        # binding its arguments, before any weight is created or loaded, so retrying is cheap.
        if "img_size" not in str(err):
            raise
        return timm.create_model(name, **kwargs)


def _build_timm(name: str) -> Callable[..., nn.Module]:
    return partial(_create_timm, name)


def _adapt_checkpoint_to_resnet_gn(state_dict: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """timm ``filter_fn`` that makes a ResNet-18 checkpoint loadable into ``resnet18_gn``.

    * BatchNorm running statistics have no counterpart in GroupNorm and are dropped (the
      affine ``weight``/``bias`` keep their names and are loaded).
    * An ImageNet 7x7 ``conv1`` does not fit a CIFAR 3x3 stem: the model's own initialisation is
      kept for it (with a warning) instead of failing the strict load.
    """
    out = {k: v for k, v in state_dict.items() if not k.endswith(_BN_STAT_SUFFIXES)}
    dropped = len(state_dict) - len(out)
    if dropped:
        logger.info("resnet18_gn: dropped %d BatchNorm running-statistics entries from the checkpoint", dropped)
    w = out.get("conv1.weight")
    if w is not None and w.shape != model.conv1.weight.shape and w.shape[-1] != model.conv1.weight.shape[-1]:
        logger.warning(
            "resnet18_gn: checkpoint conv1 %s does not fit the CIFAR stem %s; keeping its fresh init.",
            tuple(w.shape), tuple(model.conv1.weight.shape),
        )
        out["conv1.weight"] = model.conv1.weight.detach().clone()
    return out


def _build_resnet18_gn(
    *,
    num_classes: int,
    in_chans: int,
    image_size: int,
    pretrained: bool,
    pretrained_path: str | None,
    gn_groups: int = 2,
    cifar_stem: bool = False,
    **kwargs: Any,
) -> nn.Module:
    """timm ResNet-18 with GroupNorm(``gn_groups``) in place of every BatchNorm.

    Args:
        gn_groups: Number of GroupNorm groups (2 in the federated CIFAR papers).
        cifar_stem: Replace the 7x7/stride-2 stem conv and the max-pool by a 3x3/stride-1 conv, the
            usual ResNet variant for 32x32 images (the final feature map is then 4x4, not 1x1).
        **kwargs: Passed to ``timm.create_model("resnet18", ...)`` (e.g. ``drop_rate``).
    """
    if "norm_layer" in kwargs:
        raise ConfigError("resnet18_gn fixes norm_layer to GroupNorm; choose the groups with gn_groups=...")
    model = timm.create_model(
        "resnet18",
        pretrained=False,
        num_classes=num_classes,
        in_chans=in_chans,
        norm_layer=partial(timm.layers.GroupNorm, num_groups=int(gn_groups)),
        **kwargs,
    )
    if cifar_stem:
        conv1 = nn.Conv2d(in_chans, model.conv1.out_channels, kernel_size=3, stride=1, padding=1, bias=False)
        nn.init.kaiming_normal_(conv1.weight, mode="fan_out", nonlinearity="relu")  # as timm's ResNet
        # Assigning to existing attributes keeps their position in `named_parameters()`.
        model.conv1 = conv1
        model.maxpool = nn.Identity()
    if pretrained or pretrained_path is not None:
        # Load after the stem surgery, so that a checkpoint of this very architecture fits.
        cfg = dict(model.pretrained_cfg)
        if pretrained_path is not None:
            cfg.update(_local_weights_overlay(pretrained_path, cfg, num_classes))
        timm.models.load_pretrained(
            model,
            pretrained_cfg=cfg,
            num_classes=num_classes,
            in_chans=in_chans,
            filter_fn=_adapt_checkpoint_to_resnet_gn,
            strict=True,
        )
    leftover = batchnorm_modules(model)
    if leftover:  # an explicit check, not `assert`: it must also hold under `python -O`
        raise RuntimeError(f"resnet18_gn still contains BatchNorm layers: {leftover}")
    return model


class LogisticRegression(nn.Module):
    """Multinomial logistic regression: one linear layer over the flattened input (LEAF's and FedProx's model
    of the Synthetic(alpha, beta) data, whose 60 features arrive as ``pixel_values [B, 60, 1, 1]``)."""

    def __init__(self, num_classes: int, in_features: int) -> None:
        super().__init__()
        self.fc = nn.Linear(int(in_features), int(num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))


def _build_logistic(
    *,
    num_classes: int,
    in_chans: int,
    image_size: int,
    pretrained: bool,
    pretrained_path: str | None,
    **kwargs: Any,
) -> nn.Module:
    if kwargs:
        raise ConfigError(f"logistic has no options; got {', '.join(sorted(kwargs))}.")
    if pretrained and pretrained_path is None:
        raise ConfigError("logistic has no published pretrained weights: pass pretrained_path=<local file>")
    model = LogisticRegression(num_classes, in_chans * image_size * image_size)
    if pretrained_path is not None:
        model.load_state_dict(timm.models.load_state_dict(pretrained_path), strict=True)
    return model


CUSTOM_MODELS: dict[str, Callable[..., nn.Module]] = {
    "small_cnn": _build_small_cnn,
    "resnet18_gn": _build_resnet18_gn,
    "fedgam_cnn": _build_fedgam_cnn,
    "logistic": _build_logistic,
}
"""Names handled by hf_fedflat itself; every other name must be a timm model."""


# --------------------------------------------------------------------------------------------
# public helpers
# --------------------------------------------------------------------------------------------
def check_model_name(name: str, known: tuple[str, ...] | list[str] = CUSTOM_MODELS) -> None:
    """Raise a helpful ``ConfigError`` (a ``ValueError`` starting with ``model_name:``, the flag) unless ``name`` is
    in ``known`` or a timm model name.

    Args:
        name: Candidate name; timm names may carry a pretrained tag (``"resnet18.a1_in1k"``).
        known: The non-timm names accepted (the factory adds its text models).

    Raises:
        ConfigError: Listing the known names and the closest known or timm names.
    """
    if not isinstance(name, str) or not name:
        fail("model_name", f"must be a model's name, got {name!r}.")
    if name in known or timm.is_model(name):
        return
    candidates = [*known, *(n for n in timm.list_models() if n not in known)]
    close = difflib.get_close_matches(name, candidates, n=5, cutoff=0.6)
    hint = f" Closest matches: {', '.join(close)}." if close else ""
    fail("model_name", f"unknown model {name!r}. Available: {', '.join(known)}, or any timm model name "
         f"(see hf_fedflat.models.available_models(include_timm=True) or timm.list_models()).{hint}")


def build_backbone(
    architecture: str,
    *,
    num_classes: int,
    in_chans: int = 3,
    image_size: int = 32,
    pretrained: bool = False,
    pretrained_path: str | None = None,
    **model_kwargs: Any,
) -> nn.Module:
    """Build a plain ``nn.Module`` mapping images ``(B, in_chans, H, W)`` to logits ``(B, num_classes)``.

    Args:
        architecture: ``"small_cnn"``, ``"resnet18_gn"`` or a timm model name.
        num_classes: Number of output classes.
        in_chans: Number of input channels.
        image_size: Input resolution; used by ``small_cnn`` (size of its first FC layer) and passed as
            ``img_size`` to timm models that accept it (ViTs); ignored by CNNs that do not need it.
        pretrained: Load the published pretrained weights (timm; needs the Hub).
        pretrained_path: Load weights from this local file instead (implies ``pretrained``). For timm
            models it goes through ``pretrained_cfg_overlay=dict(file=path)``, so timm adapts the input
            conv and replaces a head of the wrong size.
        **model_kwargs: Architecture options (``SmallCNN`` arguments; ``gn_groups``/``cifar_stem``
            and timm options for ``resnet18_gn``; timm options such as ``depth`` or ``patch_size``).

    Returns:
        The backbone, in training mode.

    Raises:
        ValueError: For an unknown ``architecture`` or invalid options.
    """
    check_model_name(architecture)
    builder = CUSTOM_MODELS.get(architecture) or _build_timm(architecture)
    return builder(
        num_classes=int(num_classes),
        in_chans=int(in_chans),
        image_size=int(image_size),
        pretrained=bool(pretrained),
        pretrained_path=None if pretrained_path is None else os.fspath(pretrained_path),
        **model_kwargs,
    )
