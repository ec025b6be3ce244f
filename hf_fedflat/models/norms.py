"""Inspection of normalisation layers, for federated training.

BatchNorm keeps running statistics in buffers (``running_mean``, ``running_var``,
``num_batches_tracked``) that are updated in the forward pass, not by the optimizer. Federated
algorithms written for parameters (FedAvg averaging, SAM-style perturbations, FedGH gradient
harmonisation) silently mishandle these buffers, and per-client batch statistics hurt under
non-IID data; that is why the federated CIFAR literature uses ResNet-18 with GroupNorm. The
federated runner uses :func:`has_batchnorm` to refuse, or explicitly handle, such models.
"""

from __future__ import annotations

from torch import nn

__all__ = ["has_batchnorm", "batchnorm_modules"]


def _is_batchnorm(module: nn.Module) -> bool:
    # `_BatchNorm` covers BatchNorm1d/2d/3d, SyncBatchNorm, the lazy variants and timm's
    # BatchNormAct2d. Frozen BatchNorm (timm, torchvision) is not a `_BatchNorm` subclass but still
    # carries running statistics, hence the class-name test.
    return isinstance(module, nn.modules.batchnorm._BatchNorm) or "batchnorm" in type(module).__name__.lower()


def batchnorm_modules(model: nn.Module) -> list[str]:
    """List the qualified names of all BatchNorm-like modules in ``model``.

    Args:
        model: Any PyTorch module.

    Returns:
        Names as given by ``model.named_modules()`` (``""`` for the model itself), in module order.
    """
    return [name for name, module in model.named_modules() if _is_batchnorm(module)]


def has_batchnorm(model: nn.Module) -> bool:
    """Tell whether ``model`` contains any BatchNorm-like layer.

    Args:
        model: Any PyTorch module (a wrapped classifier, a timm model, ...).

    Returns:
        True if at least one submodule is a BatchNorm variant (including SyncBatchNorm, timm's
        BatchNormAct2d and frozen BatchNorm), False otherwise.
    """
    return any(_is_batchnorm(module) for module in model.modules())
