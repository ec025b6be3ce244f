"""FedSpeed's merged gradient: the gradient at w and at SAM's ascent point, mixed.

Reference: Sun et al., "FedSpeed: Larger Local Interval, Less Communication Round, and Higher Generalization
Accuracy", ICLR 2023, Algorithm 1 lines 5-8.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..algorithms.base import (
    EPS, RHO_HELP, GradientOracle, Perturbation, PieceConfig, SharpnessAware, Tensor, ascent_offset, check_number,
    global_norm, hyperparameter, register_perturbation,
)


@dataclass
class FedSpeedSAMConfig(PieceConfig):
    rho: float = hyperparameter(0.1, RHO_HELP)
    fedspeed_alpha: float = hyperparameter(
        0.5, "FedSpeed: weight alpha of the perturbed gradient in g = (1 - alpha) g_1 + alpha g_2.")

    def validate(self) -> None:
        check_number("rho", self.rho, low=0.0)
        check_number("fedspeed_alpha", self.fedspeed_alpha, low=0.0, high=1.0)


@register_perturbation
class FedSpeedSAMPerturbation(Perturbation, SharpnessAware):
    """``g_1 = grad F(w; B)``, ``g_2 = grad F(w + rho g_1/||g_1||; B)``, ``d = (1 - alpha) g_1 + alpha g_2``
    (alpha = 1: SAM). Reported loss: at ``w``."""

    name = "fedspeed_sam"
    passes_per_step = 2
    config_class = FedSpeedSAMConfig

    def direction(self, grad_at: GradientOracle, workspace) -> tuple[Tensor, Tensor]:
        loss, g1 = grad_at(None)
        _, g2 = grad_at(g1 * (self.config.rho / (global_norm(g1) + EPS)))
        alpha = self.config.fedspeed_alpha
        return loss, torch.add(torch.mul(g1, 1.0 - alpha), g2, alpha=alpha)

    def drift_offset(self, workspace, local_gradient: Tensor) -> Tensor:
        return ascent_offset(local_gradient, self.config.rho)
