"""Sharpness-aware minimization (FedSAM's client step).

Reference: Foret et al., "Sharpness-Aware Minimization for Efficiently Improving Generalization",
ICLR 2021; in FL: Qu et al., ICML 2022 (FedSAM), Caldarola et al., ECCV 2022.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..algorithms.base import EPS, RHO_HELP, GradFn, Perturbation, SharpnessAware, Tensor, ascent_offset
from ..algorithms.device_checks import checked_norm, select, usable_offset
from ..algorithms.hyperparameters import PieceConfig, check_number, hyperparameter
from ..algorithms.registry import register_perturbation


@dataclass
class SAMConfig(PieceConfig):
    rho: float = hyperparameter(0.05, RHO_HELP)

    def validate(self) -> None:
        check_number("rho", self.rho, low=0.0)


@register_perturbation
class SAMPerturbation(Perturbation, SharpnessAware):
    """``e = rho * g / ||g||``, ``d = grad F(w + e; B)`` on the same minibatch B.

    The norm is global over all trainable parameters. When ``||g||`` is not finite (an fp16 overflow
    the loss scaler will skip anyway) the step falls back to ``g``, tested on the device on accelerators
    (:mod:`~hf_fedflat.algorithms.device_checks`: no host sync). The reported loss is the loss at
    ``w``. Normalisation layers run in training mode in both passes; the federated models here use
    GroupNorm, which has no running statistics to disturb.
    """

    name = "sam"
    passes_per_step = 2
    config_class = SAMConfig

    def direction(self, grad_at: GradFn, workspace) -> tuple[Tensor, Tensor]:
        loss, grad = grad_at(None)
        norm, ok = checked_norm(grad)
        if ok is False:
            return loss, grad
        _, perturbed_grad = grad_at(usable_offset(grad * (self.config.rho / (norm + EPS)), ok))
        return loss, select(ok, perturbed_grad, grad)

    def drift_offset(self, workspace, local_gradient: Tensor) -> Tensor:
        return ascent_offset(local_gradient, self.config.rho)
