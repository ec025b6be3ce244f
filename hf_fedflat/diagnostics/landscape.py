"""Loss-landscape measurements of a model at given weights: full-data loss and gradient, global sharpness,
and the loss surface along two filter-normalised random directions.

Everything runs in eval mode (no dropout) on a fixed dataset, so the numbers are comparable across rounds.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import torch

from ..algorithms.base import EPS, global_norm
from ..training.parameters import ParameterSpace


def _batches(trainer, dataset) -> Iterable[dict]:
    """Collated batches of ``dataset`` from the Trainer's own eval dataloader, on the model's device."""
    loader = trainer.get_eval_dataloader(dataset)
    device = trainer.space.device
    for batch in loader:
        yield {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def _batch_size(batch: dict) -> int:
    for value in batch.values():
        if isinstance(value, torch.Tensor) and value.ndim > 0:
            return int(value.shape[0])
    return 1


def loss_and_gradient(trainer, dataset, params: torch.Tensor | None = None, with_gradient: bool = True):
    """``(mean loss, flat gradient or None)`` of the trainer's model over all of ``dataset``.

    ``params`` (flat) are loaded first when given. The mean is over samples (batch losses weighted by size).
    """
    model, space = trainer.model, trainer.space
    if params is not None:
        space.load_(params)
    was_training = model.training
    model.eval()
    total_loss, total = 0.0, 0
    gradient = torch.zeros(space.numel, device=space.device) if with_gradient else None
    try:
        for batch in _batches(trainer, dataset):
            n = _batch_size(batch)
            with torch.set_grad_enabled(with_gradient):
                loss = model(**batch)["loss"]
            if with_gradient:
                grads = torch.autograd.grad(loss, space.params, allow_unused=True)
                gradient.add_(torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1)
                                         for g, p in zip(grads, space.params)]), alpha=n)
            total_loss += float(loss.detach()) * n
            total += n
    finally:
        model.train(was_training)
    if total == 0:
        raise ValueError("loss_and_gradient: the dataset is empty.")
    return total_loss / total, (gradient / total if with_gradient else None)


def global_sharpness(trainer, dataset, params: torch.Tensor, rho: float) -> dict[str, float]:
    """Loss rise under the rho-ball perturbation along the full-data gradient: ``L(w + rho g/||g||) - L(w)``."""
    loss, gradient = loss_and_gradient(trainer, dataset, params)
    offset = gradient * (rho / (global_norm(gradient) + EPS))
    perturbed, _ = loss_and_gradient(trainer, dataset, params + offset.to(params.device), with_gradient=False)
    trainer.space.load_(params)
    return {"sharpness": perturbed - loss, "sharpness_loss": loss}


def filter_normalized_direction(space: ParameterSpace, params: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """A random direction scaled filter by filter to the weights' norms (Li et al., NeurIPS 2018).

    Each output filter (slice along dim 0) of a weight with 2+ dims gets the norm of the same filter of
    the weights; 1-D parameters (biases, norm scales) get zero, as in the paper.
    """
    pieces = []
    for weight in space.split(params.detach().cpu()):
        if weight.ndim < 2:
            pieces.append(torch.zeros_like(weight).reshape(-1))
            continue
        direction = torch.randn(weight.shape, generator=generator, dtype=weight.dtype)
        filters_d = direction.reshape(weight.shape[0], -1)
        filters_w = weight.reshape(weight.shape[0], -1)
        scale = filters_w.norm(dim=1, keepdim=True) / (filters_d.norm(dim=1, keepdim=True) + EPS)
        pieces.append((filters_d * scale).reshape(-1))
    return torch.cat(pieces)


def loss_surface(trainer, dataset, params: torch.Tensor, resolution: int = 11, span: float = 1.0,
                 seed: int = 0) -> dict:
    """Loss on a ``resolution x resolution`` grid ``w + a*d1 + b*d2``, ``a, b in [-span, span]``."""
    generator = torch.Generator().manual_seed(seed)
    d1 = filter_normalized_direction(trainer.space, params, generator).to(params.device)
    d2 = filter_normalized_direction(trainer.space, params, generator).to(params.device)
    coords = np.linspace(-span, span, resolution)
    losses = np.zeros((resolution, resolution))
    for i, a in enumerate(coords):
        for j, b in enumerate(coords):
            losses[i, j], _ = loss_and_gradient(trainer, dataset, params + a * d1 + b * d2, with_gradient=False)
    trainer.space.load_(params)
    return {"coords": coords.tolist(), "losses": losses.tolist()}


def plot_loss_surface(surface: dict, path: str, title: str = "Loss surface") -> str:
    """Contour plot of :func:`loss_surface`'s grid as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    coords = np.asarray(surface["coords"])
    losses = np.asarray(surface["losses"])
    fig, ax = plt.subplots(figsize=(5, 4.2))
    grid_a, grid_b = np.meshgrid(coords, coords, indexing="ij")
    contour = ax.contourf(grid_a, grid_b, losses, levels=20, cmap="viridis")
    ax.contour(grid_a, grid_b, losses, levels=10, colors="white", linewidths=0.5)
    fig.colorbar(contour, ax=ax, label="loss")
    ax.plot([0], [0], "r*", markersize=10)
    ax.set_xlabel("direction 1 (filter-normalised)")
    ax.set_ylabel("direction 2 (filter-normalised)")
    ax.set_title(title)
    fig.tight_layout()
    from ..io import atomic_savefig  # never through a symbolic link at path

    try:
        atomic_savefig(fig, path, dpi=110)
    finally:
        plt.close(fig)
    return path
