"""The model's representation: the features its classification head receives (MOON, FedDecorr).

One rule for every model hf_fedflat trains, found once per model and captured by a forward pre-hook on
the head (so the model's own ``forward`` runs unchanged, whatever its signature):

* a module with timm's ``get_classifier()`` (timm backbones inside :class:`FedFlatImageClassifier`,
  bare timm models): the module it returns, i.e. the input of the head after ``forward_features`` and the
  head's pooling (``forward_head(pre_logits=True)``);
* otherwise the **last** ``nn.Linear`` registered in the model (transformers classifiers: BERT's and ViT's
  ``classifier``, DistilBERT's ``classifier`` after ``pre_classifier``, RoBERTa's ``out_proj``, GPT-2/Llama's
  ``score``, a causal LM's ``lm_head``; hf_fedflat's small CNNs' last layer). With LoRA's
  ``modules_to_save`` the trained copy of the head is registered last.

A model can name its head itself with an attribute ``representation_module`` (a module or a dotted name).
The captured input is pooled to ``(batch, features)``: a sequence ``(batch, tokens, features)`` is averaged
over the tokens, over the attended ones when the batch has an ``attention_mask`` of that shape.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch import nn
from ..field_checks import ConfigError


def representation_module(model: nn.Module) -> nn.Module:
    """The module whose input is the representation (see the module docstring); ``ValueError`` when none."""
    named = getattr(model, "representation_module", None)
    if isinstance(named, nn.Module):
        return named
    if isinstance(named, str):
        return model.get_submodule(named)
    for module in model.modules():
        get_classifier = getattr(module, "get_classifier", None)
        if callable(get_classifier):
            head = get_classifier()
            if isinstance(head, nn.Module) and any(True for _ in head.parameters()):
                return head
    last = None
    for module in model.modules():
        if isinstance(module, nn.Linear):
            last = module
    if last is None:
        raise ConfigError(f"{type(model).__qualname__} has no classification head to read a representation from "
                         "(no timm get_classifier(), no nn.Linear): set model.representation_module to the module "
                         "whose input is the representation.")
    return last


def pool(features: torch.Tensor, attention_mask: Any = None) -> torch.Tensor:
    """``(batch, features)`` from the head's input: as it is when 2-D, else the mean over the middle dims (over the
    attended tokens when ``attention_mask`` is ``(batch, tokens)``)."""
    if features.dim() == 2:
        return features
    if features.dim() < 2:
        raise ConfigError(f"A representation needs a batch and a feature dimension, got shape {tuple(features.shape)}.")
    if (features.dim() == 3 and isinstance(attention_mask, torch.Tensor)
            and tuple(attention_mask.shape) == tuple(features.shape[:2])):
        mask = attention_mask.to(features.dtype).unsqueeze(-1)
        return (features * mask).sum(dim=1) / mask.sum(dim=1).clamp_min(1.0)
    return features.reshape(features.shape[0], -1, features.shape[-1]).mean(dim=1)


class RepresentationCapture:
    """Keeps the head's input of the last forward of ``model`` while active (``with capture.active(): ...``)."""

    def __init__(self, model: nn.Module):
        self.head = representation_module(model)
        self.value: torch.Tensor | None = None

    def _hook(self, module, args):
        self.value = args[0]

    @contextlib.contextmanager
    def active(self) -> Iterator["RepresentationCapture"]:
        self.value = None
        handle = self.head.register_forward_pre_hook(self._hook)
        try:
            yield self
        finally:
            handle.remove()

    def take(self, attention_mask: Any = None) -> torch.Tensor:
        if self.value is None:
            raise RuntimeError(f"The forward pass did not run the head {type(self.head).__qualname__}: no "
                               "representation was captured (set model.representation_module).")
        value, self.value = self.value, None
        return pool(value, attention_mask)
