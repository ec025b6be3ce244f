"""Sharpness-aware minimization (FedSAM's client step).

Reference: Foret et al., "Sharpness-Aware Minimization for Efficiently Improving Generalization",
ICLR 2021; in FL: Qu et al., ICML 2022 (FedSAM), Caldarola et al., ECCV 2022.
"""

import torch

from ..algorithms.base import EPS, GradFn, Perturbation, Tensor, global_norm
from ..algorithms.registry import register_perturbation


@register_perturbation
class SAMPerturbation(Perturbation):
    """``e = rho * g / ||g||``, ``d = grad F(w + e; B)`` on the same minibatch B.

    The norm is global over all trainable parameters. When ``||g||`` is not finite (an fp16 overflow
    the loss scaler will skip anyway) the step falls back to ``g``. The reported loss is the loss at
    ``w``. Normalisation layers run in training mode in both passes; the federated models here use
    GroupNorm, which has no running statistics to disturb.
    """

    name = "sam"
    passes_per_step = 2

    def __init__(self, rho: float = 0.05):
        if rho < 0:
            raise ValueError(f"rho must be >= 0, got {rho}.")
        self.rho = rho

    @classmethod
    def from_args(cls, args) -> "SAMPerturbation":
        return cls(rho=args.rho)

    def direction(self, grad_at: GradFn, workspace) -> tuple[Tensor, Tensor]:
        loss, grad = grad_at(None)
        norm = global_norm(grad)
        if not torch.isfinite(norm):
            return loss, grad
        _, perturbed_grad = grad_at(grad * (self.rho / (norm + EPS)))
        return loss, perturbed_grad
