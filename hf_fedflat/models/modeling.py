"""A ``transformers.PreTrainedModel`` around the backbones of :mod:`hf_fedflat.models.backbones`.

Why a ``PreTrainedModel`` rather than a bare ``nn.Module``: the ``transformers.Trainer`` then saves
checkpoints the Hugging Face way (``config.json`` + ``model.safetensors``), ``from_pretrained``
rebuilds the architecture from ``config.json`` alone (no Hub access, no pickled code), and the
model can be pushed to / pulled from the Hub like any other.

transformers 5.x notes (they shaped ``_init_weights`` below):

* ``post_init()`` calls ``initialize_weights()``, which runs ``_init_weights`` on every module. The
  default ``_init_weights`` draws every Linear/Conv weight from N(0, 0.02) and resets every norm,
  which would silently replace timm's initialisation (and local pretrained weights!) of a freshly
  built model.
* ``from_pretrained`` builds the model on the ``meta`` device, loads the checkpoint, then gives
  the *missing* parameters and *all non-persistent buffers* uninitialised memory
  (``torch.empty_like``) and calls ``initialize_weights()`` so that ``_init_weights`` fills them.
  Loaded tensors carry ``_is_hf_initialized = True`` and the ``transformers.initialization``
  functions (and, during ``initialize_weights``, ``torch.nn.init`` itself) skip such tensors.
* For a model defined outside transformers ("custom code"), a tensor already marked
  ``_is_hf_initialized`` before loading is taken as loaded and dropped from the missing keys.

So the wrapper marks every real (non-meta) tensor of a freshly built backbone as initialised
before ``post_init()`` -- never the meta tensors of a model under construction by
``from_pretrained`` -- and ``_init_weights`` (a) initialises only unmarked tensors, i.e. keys
missing from a checkpoint, and (b) recomputes non-persistent buffers with timm's
``init_non_persistent_buffers()`` (relative-position indices of Swin/BEiT/EVA, ...); without (b) a
reloaded Swin indexes its bias table with garbage.
"""

# No `from __future__ import annotations` in this file: the `@strict` config dataclass validates
# field types from real annotations and silently skips the checks when they are strings.
from typing import Any

import torch
import torch.nn.functional as F
from huggingface_hub.dataclasses import strict
from torch import nn
from transformers import AutoConfig, AutoModel, AutoModelForImageClassification, PreTrainedConfig, PreTrainedModel
from transformers import initialization as hf_init
from transformers.modeling_outputs import ImageClassifierOutput

from .backbones import build_backbone
from ..field_checks import ConfigError

__all__ = ["FedFlatClassifierConfig", "FedFlatImageClassifier"]

# Module types whose parameters the default `PreTrainedModel._init_weights` initialises.
_HF_INIT_TYPES = (
    nn.Linear,
    nn.modules.conv._ConvNd,
    nn.Embedding,
    nn.GroupNorm,
    nn.LayerNorm,
    nn.modules.batchnorm._BatchNorm,
)


@strict
class FedFlatClassifierConfig(PreTrainedConfig):
    r"""Configuration of :class:`FedFlatImageClassifier`: everything needed to rebuild the backbone.

    Args:
        architecture: Factory name: ``"small_cnn"``, ``"resnet18_gn"`` or a timm model name.
        num_classes: Number of output classes.
        in_chans: Number of input image channels.
        image_size: Input resolution (square images).
        model_kwargs: Extra architecture options given to the factory (JSON-serialisable, e.g.
            ``{"depth": 2, "patch_size": 8}`` for a timm ViT, ``{"cifar_stem": true}`` for
            ``resnet18_gn``).
    """

    model_type = "hf_fedflat_classifier"

    architecture: str = "small_cnn"
    num_classes: int = 10
    in_chans: int = 3
    image_size: int = 32
    model_kwargs: dict[str, Any] | None = None

    def __post_init__(self, **kwargs):
        # Keep the generic `num_labels`/`id2label` of transformers in line with `num_classes`, so
        # that tools reading them (pipelines, model cards) see the real number of classes.
        if self.id2label is None:
            kwargs.setdefault("num_labels", self.num_classes)
        super().__post_init__(**kwargs)
        if self.num_labels != self.num_classes:
            raise ConfigError(f"num_labels={self.num_labels} disagrees with num_classes={self.num_classes}")


class FedFlatImageClassifier(PreTrainedModel):
    """Image classifier: a backbone returning logits plus the cross-entropy loss the Trainer needs.

    Build it with :func:`hf_fedflat.models.create_model`; reload it with
    ``FedFlatImageClassifier.from_pretrained(dir)`` or :func:`hf_fedflat.models.load_model`.

    Args:
        config: The architecture description; the backbone is built from it (randomly initialised).
        backbone: An already built backbone matching ``config`` (e.g. with pretrained weights, as
            :func:`create_model` passes it); its weights are kept as they are.
    """

    config_class = FedFlatClassifierConfig
    config: FedFlatClassifierConfig
    main_input_name = "pixel_values"
    input_modalities = ("image",)
    # forward() takes no `num_items_in_batch`: the Trainer must not pass loss kwargs to it. The loss
    # is the mean over the micro-batch, which the Trainer scales for gradient accumulation.
    accepts_loss_kwargs = False
    _no_split_modules: list[str] = []

    def __init__(self, config: FedFlatClassifierConfig, backbone: nn.Module | None = None) -> None:
        super().__init__(config)
        if backbone is None:
            backbone = build_backbone(
                config.architecture,
                num_classes=config.num_classes,
                in_chans=config.in_chans,
                image_size=config.image_size,
                pretrained=False,
                **(config.model_kwargs or {}),
            )
        self.backbone = backbone
        # The backbone is initialised by its own code (timm / PyTorch defaults / pretrained file):
        # mark it so that post_init() -> initialize_weights() leaves it alone. Meta tensors (the
        # model is being built by from_pretrained()) must stay unmarked: transformers treats a marked
        # tensor of a custom-code model as loaded, so marking them would hide keys missing from the
        # checkpoint (they would silently stay on the meta device). from_pretrained() marks the
        # tensors it loads itself.
        for tensor in (*self.backbone.parameters(), *self.backbone.buffers()):
            if not tensor.is_meta:
                tensor._is_hf_initialized = True
        self.post_init()

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """Initialise what was not initialised yet (see the module docstring for why).

        * Recompute the non-persistent buffers of timm modules (never stored in a checkpoint and
          left as ``empty_like`` garbage by ``from_pretrained`` in transformers 5.x).
        * Parameters still without ``_is_hf_initialized`` (keys missing from a loaded checkpoint,
          which transformers reports) get transformers' default initialisation; free parameters of
          other modules (position embeddings, class tokens, ...) get a truncated N(0, 0.02).

        Tensors of a freshly built or fully loaded model are all marked, so this is then a no-op
        apart from recomputing the (deterministic) non-persistent buffers.
        """
        if hasattr(module, "init_non_persistent_buffers"):
            module.init_non_persistent_buffers()
        persistent = [b for n, b in module.named_buffers(recurse=False) if n not in module._non_persistent_buffers_set]
        params = list(module.parameters(recurse=False))
        if all(getattr(t, "_is_hf_initialized", False) for t in (*params, *persistent)):
            return
        cls_name = type(module).__name__
        if isinstance(module, _HF_INIT_TYPES) or "LayerNorm" in cls_name or "RMSNorm" in cls_name:
            super()._init_weights(module)  # guarded: leaves marked (loaded) tensors untouched
        else:
            for param in params:
                hf_init.trunc_normal_(param, std=0.02)  # guarded as well

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor | None = None) -> ImageClassifierOutput:
        """Classify a batch of images.

        Args:
            pixel_values: Images ``(B, in_chans, H, W)``, float.
            labels: Optional class indices ``(B,)``.

        Returns:
            ``ImageClassifierOutput`` with ``logits`` ``(B, num_classes)`` and, when ``labels`` are
            given, ``loss`` = mean cross-entropy over the batch (``None`` otherwise). Returning a
            ModelOutput with ``loss`` (not bare logits) is what keeps the Trainer's evaluation loop
            from dropping samples.
        """
        logits = self.backbone(pixel_values)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits, labels.to(device=logits.device, dtype=torch.long))
        return ImageClassifierOutput(loss=loss, logits=logits)


# Let the Auto classes (AutoConfig/AutoModel/AutoModelForImageClassification.from_pretrained) resolve
# "hf_fedflat_classifier" once hf_fedflat.models is imported.
AutoConfig.register(FedFlatClassifierConfig.model_type, FedFlatClassifierConfig, exist_ok=True)
AutoModel.register(FedFlatClassifierConfig, FedFlatImageClassifier, exist_ok=True)
AutoModelForImageClassification.register(FedFlatClassifierConfig, FedFlatImageClassifier, exist_ok=True)
