"""Adaptive SAM: SAM's ascent step rescaled by the weights' own magnitude (FedASAM's client step).

References: Kwon et al., "ASAM: Adaptive Sharpness-Aware Minimization for Scale-Invariant Learning of Deep Neural
Networks", ICML 2021; in FL: Caldarola et al., "Improving Generalization in Federated Learning by Seeking Flat
Minima", ECCV 2022 (FedASAM).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..algorithms.base import (
    EPS, RHO_HELP, GradientOracle, Perturbation, PieceConfig, Tensor, check_number, global_norm,
    hyperparameter, register_perturbation,
)

#: the parameters whose entries are rescaled: those whose name contains it (convolution, linear and
#: normalisation-layer weights); every other parameter (biases) has ``T = 1``
WEIGHT_NAME = "weight"


@dataclass
class ASAMConfig(PieceConfig):
    rho: float = hyperparameter(0.7, RHO_HELP)
    asam_eta: float = hyperparameter(
        0.2, "ASAM: eta_a in T = |w| + eta_a, the scale of a weight tensor's entries (FedASAM: 0.2 on CIFAR).")

    def validate(self) -> None:
        check_number("rho", self.rho, low=0.0)
        check_number("asam_eta", self.asam_eta, low=0.0)


@register_perturbation
class ASAMPerturbation(Perturbation):
    """``T = |w| + eta_a`` on the entries of weight tensors, ``T = 1`` on biases; ``e = rho * T^2 g / ||T g||``
    (one global norm); ``d = grad F(w + e; B)`` on the same minibatch B.

    A parameter counts as a weight tensor when its name contains ``"weight"`` (as in the FedASAM code); the mask
    comes from the gradient oracle (``grad_at.parameter_mask``), built once per run. The reported loss is the loss
    at ``w``. Not a :class:`SharpnessAware` piece: its offset depends on ``w`` and the parameter names, which the
    perturbation-drift diagnostic does not give it.
    """

    name = "asam"
    passes_per_step = 2
    config_class = ASAMConfig

    def direction(self, grad_at: GradientOracle, workspace) -> tuple[Tensor, Tensor]:
        loss, g = grad_at(None)
        _, g_asam = grad_at(self._ascent(grad_at.weights(), grad_at.parameter_mask(WEIGHT_NAME), g))
        return loss, g_asam

    def _ascent(self, w: Tensor, weight_mask: Tensor, g: Tensor) -> Tensor:
        """``rho * T^2 g / ||T g||`` (a new vector)."""
        scale = torch.where(weight_mask, w.abs().add_(self.config.asam_eta), 1.0)
        scaled_gradient = scale * g  # T g
        norm = global_norm(scaled_gradient)
        return scaled_gradient.mul_(scale).mul_(self.config.rho / (norm + EPS))

