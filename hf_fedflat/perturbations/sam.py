"""Sharpness-aware minimization (FedSAM's client step).

Reference: Foret et al., "Sharpness-Aware Minimization for Efficiently Improving Generalization",
ICLR 2021; in FL: Qu et al., ICML 2022 (FedSAM), Caldarola et al., ECCV 2022.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..algorithms.base import (
    EPS, RHO_HELP, GradientOracle, Perturbation, PieceConfig, SharpnessAware, Tensor, ascent_offset, check_number,
    global_norm, hyperparameter, register_perturbation,
)


@dataclass
class SAMConfig(PieceConfig):
    rho: float = hyperparameter(0.05, RHO_HELP)

    def validate(self) -> None:
        check_number("rho", self.rho, low=0.0)


@register_perturbation
class SAMPerturbation(Perturbation, SharpnessAware):
    """``e = rho * g / ||g||``, ``d = grad F(w + e; B)`` on the same minibatch B.

    The norm is global over all trainable parameters. The reported loss is the loss at ``w``. Normalisation
    layers run in training mode in both passes; the federated models here use GroupNorm, which has no running
    statistics to disturb.
    """

    name = "sam"
    passes_per_step = 2
    config_class = SAMConfig

    def direction(self, grad_at: GradientOracle, workspace) -> tuple[Tensor, Tensor]:
        loss, g = grad_at(None)
        _, g_sam = grad_at(g * (self.config.rho / (global_norm(g) + EPS)))
        return loss, g_sam

    def drift_offset(self, workspace, local_gradient: Tensor) -> Tensor:
        return ascent_offset(local_gradient, self.config.rho)
