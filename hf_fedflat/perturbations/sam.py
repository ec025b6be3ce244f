"""Sharpness-aware minimization (FedSAM's client step).

Reference: Foret et al., "Sharpness-Aware Minimization for Efficiently Improving Generalization",
ICLR 2021; in FL: Qu et al., ICML 2022 (FedSAM), Caldarola et al., ECCV 2022.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..algorithms.base import (
    EPS, RHO_HELP, RHO_START_HELP, RHO_WARMUP_HELP, ClientContext, GradientOracle, Perturbation, PieceConfig,
    SharpnessAware, Tensor, ascent_offset, check_integer, check_number, global_norm, hyperparameter, ramped_radius,
    register_perturbation,
)


@dataclass
class SAMConfig(PieceConfig):
    rho: float = hyperparameter(0.05, RHO_HELP)
    rho_start: float = hyperparameter(0.001, RHO_START_HELP)
    rho_warmup_rounds: int = hyperparameter(0, RHO_WARMUP_HELP)

    def validate(self) -> None:
        check_number("rho", self.rho, low=0.0)
        check_number("rho_start", self.rho_start, low=0.0)
        check_integer("rho_warmup_rounds", self.rho_warmup_rounds, low=0)


@register_perturbation
class SAMPerturbation(Perturbation, SharpnessAware):
    """``e = rho * g / ||g||``, ``d = grad F(w + e; B)`` on the same minibatch B.

    The norm is global over all trainable parameters. The reported loss is the loss at ``w``. Normalisation
    layers run in training mode in both passes; the federated models here use GroupNorm, which has no running
    statistics to disturb.

    With ``rho_warmup_rounds`` ``T_s > 1`` the radius of round ``t`` ramps linearly from ``rho_start`` to ``rho``
    over the first ``T_s`` rounds (FedGloSS's client radius); the workspace is then the round's radius (None: ``rho``).
    """

    name = "sam"
    passes_per_step = 2
    config_class = SAMConfig

    def begin(self, ctx: ClientContext) -> float | None:
        config = self.config
        if config.rho_warmup_rounds <= 1:
            return None
        return ramped_radius(config.rho, config.rho_start, config.rho_warmup_rounds, ctx.round)

    def direction(self, grad_at: GradientOracle, workspace) -> tuple[Tensor, Tensor]:
        rho = self.config.rho if workspace is None else workspace
        loss, g = grad_at(None)
        _, g_sam = grad_at(g * (rho / (global_norm(g) + EPS)))
        return loss, g_sam

    def drift_offset(self, workspace, local_gradient: Tensor) -> Tensor:
        return ascent_offset(local_gradient, self.config.rho if workspace is None else workspace)
