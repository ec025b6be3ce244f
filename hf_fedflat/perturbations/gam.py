"""Gradient-norm-aware minimization: the FedGAM form (2 passes) and the original accelerated GAM (4 passes).

References: Zhang et al., "Gradient Norm Aware Minimization Seeks First-Order Flatness and Improves
Generalization", CVPR 2023 (original GAM); FedGAM / FedGAM-CV (2024) and DFedGAM (2025) use the
two-pass form of their eq. (19).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..algorithms.base import (
    EPS, RHO_HELP, GradientOracle, Perturbation, PieceConfig, SharpnessAware, Tensor, ascent_offset, check_number,
    global_norm, hyperparameter, register_perturbation,
)


def unit(vector: Tensor) -> Tensor:
    """``v / ||v||``."""
    return vector / (global_norm(vector) + EPS)


@dataclass
class GAMConfig(PieceConfig):
    rho: float = hyperparameter(0.02, RHO_HELP)
    gam_alpha: float = hyperparameter(
        0.2, "GAM (FedGAM form): weight alpha in d = g + alpha*rho*grad F(w + rho*g/||g||) (paper: 0.2).")

    def validate(self) -> None:
        check_number("rho", self.rho, low=0.0)
        check_number("gam_alpha", self.gam_alpha, low=0.0)


@register_perturbation
class GAMPerturbation(Perturbation, SharpnessAware):
    """FedGAM's step: ``d = g + alpha * rho * grad F(w + rho * g/||g||; B)`` on the same minibatch B.

    The second term is the gradient of the first-order flatness surrogate ``rho * ||grad F||`` evaluated
    at the ascent point, as the FedGAM paper writes it (defaults rho=0.02, alpha=0.2). The reported loss
    is the loss at ``w``.
    """

    name = "gam"
    passes_per_step = 2
    config_class = GAMConfig

    def direction(self, grad_at: GradientOracle, workspace) -> tuple[Tensor, Tensor]:
        rho, alpha = self.config.rho, self.config.gam_alpha
        loss, g = grad_at(None)
        _, g_ascent = grad_at(unit(g) * rho)
        return loss, torch.add(g, g_ascent, alpha=alpha * rho, out=g_ascent)  # g + alpha rho g_ascent

    def drift_offset(self, workspace, local_gradient: Tensor) -> Tensor:
        return ascent_offset(local_gradient, self.config.rho)


@dataclass
class OriginalGAMConfig(PieceConfig):
    rho: float = hyperparameter(0.2, RHO_HELP)
    gam_rho_prime: float = hyperparameter(
        0.03, "Original GAM: radius rho' of the inner gradient-norm perturbation (0.03).")
    gam_grad_alpha: float = hyperparameter(
        0.1, "Original GAM: alpha mixing g1 and g3 in h+ = alpha*g1 + (1-alpha)*g3 (0.1).")
    gam_grad_beta: float = hyperparameter(
        0.1, "Original GAM: beta mixing g0 and g2 in h- = beta*g0 + (1-beta)*g2 (0.1).")
    gam_gamma: float = hyperparameter(0.05, "Original GAM: weight gamma of the projected h- term (0.05).")

    def validate(self) -> None:
        check_number("rho", self.rho, low=0.0)
        check_number("gam_rho_prime", self.gam_rho_prime, low=0.0)
        for name in ("gam_grad_alpha", "gam_grad_beta", "gam_gamma"):
            check_number(name, getattr(self, name), low=0.0, high=1.0)


@register_perturbation
class OriginalGAMPerturbation(Perturbation, SharpnessAware):
    """The accelerated GAM of Zhang et al. (official code), four passes per step.

    ``g0 = grad(w)``, ``g1 = grad(w + rho' g0/||g0||)``, ``h0 = g1 - g0``, ``w2 = w + rho h0/||h0||``,
    ``g2 = grad(w2)``, ``g3 = grad(w2 + rho' g2/||g2||)``, ``h+ = alpha g1 + (1-alpha) g3``,
    ``h- = beta g0 + (1-beta) g2``, ``d = h+ - gamma * (h- - (h-.h+/||h+||^2) h+)`` (h- with its
    component along h+ removed). Defaults rho=0.2, rho'=0.03, alpha=0.1, beta=0.1, gamma=0.05.
    """

    name = "gam_original"
    passes_per_step = 4
    config_class = OriginalGAMConfig

    def direction(self, grad_at: GradientOracle, workspace) -> tuple[Tensor, Tensor]:
        c = self.config
        loss, g0 = grad_at(None)
        _, g1 = grad_at(unit(g0) * c.gam_rho_prime)
        e2 = unit(g1 - g0) * c.rho  # w2 = w + e2, h0 = g1 - g0
        _, g2 = grad_at(e2)
        _, g3 = grad_at(e2 + unit(g2) * c.gam_rho_prime)
        h_plus = g1.mul(c.gam_grad_alpha).add_(g3, alpha=1 - c.gam_grad_alpha)
        h_minus = g0.mul(c.gam_grad_beta).add_(g2, alpha=1 - c.gam_grad_beta)
        along = torch.dot(h_minus, h_plus) / (torch.dot(h_plus, h_plus) + EPS)
        orthogonal = h_minus.addcmul_(h_plus, along, value=-1)  # h- - along h+ (the product fused into the sum)
        return loss, h_plus.sub_(orthogonal, alpha=c.gam_gamma)

    def drift_offset(self, workspace, local_gradient: Tensor) -> Tensor:
        return ascent_offset(local_gradient, self.config.rho)
