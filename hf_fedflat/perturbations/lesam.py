"""LESAM: SAM whose perturbation is the locally estimated global one, at the cost of one pass per step.

Reference: Fan et al., "Locally Estimated Global Perturbations are Better than Local Perturbations for
Federated Sharpness-aware Minimization", ICML 2024 (FedLESAM).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..algorithms.base import (
    EPS, RHO_HELP, ClientContext, FixedOffsetPerturbation, LocalResult, PieceConfig, RoundSummary, SharpnessAware,
    StateDict, Tensor, check_choice, check_number, global_norm, hyperparameter, register_perturbation,
)

PER_CLIENT, LAST_GLOBAL_UPDATE = "per_client", "last_global_update"
LESAM_DIRECTIONS = (PER_CLIENT, LAST_GLOBAL_UPDATE)


@dataclass
class LESAMConfig(PieceConfig):
    rho: float = hyperparameter(0.05, RHO_HELP)
    lesam_direction: str = hyperparameter(
        PER_CLIENT,
        "LESAM's estimate of the global perturbation: 'per_client' (paper: w_old_i - w^t with w_old_i the global "
        "model the client received when it last took part) or 'last_global_update' (public code: w^{t-1} - w^t "
        "for everyone).")

    def validate(self) -> None:
        check_number("rho", self.rho, low=0.0)
        check_choice("lesam_direction", self.lesam_direction, LESAM_DIRECTIONS)


@register_perturbation
class LESAMPerturbation(FixedOffsetPerturbation, SharpnessAware):
    """``e_i = rho * (w_old_i - w^t) / ||w_old_i - w^t||``, fixed for the round; ``d = grad F_i(w + e_i; B)``.

    ``w_old_i`` (default, the paper) is the global model client i received the last time it took part,
    kept as client state ``{"w_old"}`` in the client-state store (which spills to disk past its memory
    budget). With ``lesam_direction="last_global_update"`` (the public code) every client uses
    ``w^{t-1} - w^t``, kept by this piece's server half and broadcast. Without an estimate (first
    participation, round 0, or a zero difference) the step is plain ERM. One forward and backward per
    step; the reported loss is the loss at the perturbed point (the loss at ``w`` would cost a pass).
    """

    name = "lesam"
    config_class = LESAMConfig

    @property
    def per_client(self) -> bool:
        return self.config.lesam_direction == PER_CLIENT

    @property
    def client_state_keys(self) -> tuple[str, ...]:  # its per-client state (see ClientPiece)
        return ("w_old",) if self.per_client else ()

    def begin(self, ctx: ClientContext) -> dict[str, Tensor | None]:
        if self.per_client:
            w_old = ctx.state.get(self.name, {}).get("w_old")
            estimate = None if w_old is None else torch.sub(w_old, ctx.global_params)
        else:
            estimate = torch.neg(ctx.broadcast[self.name]["last_update"])  # w^{t-1} - w^t
        offset = None
        if estimate is not None:
            norm = global_norm(estimate)
            if torch.isfinite(norm) and norm > 0:
                offset = estimate.mul_(self.config.rho / (norm + EPS))
        return {"offset": offset}

    def offset(self, workspace) -> Tensor | None:
        return workspace["offset"]

    def drift_offset(self, workspace, local_gradient: Tensor) -> Tensor | None:
        return workspace["offset"]  # the estimate itself, whatever the local gradient

    def end(self, ctx: ClientContext, workspace, result: LocalResult) -> tuple[StateDict | None, StateDict]:
        if self.per_client:
            return {"w_old": ctx.global_params}, {}
        return None, {}

    # server half (only for last_global_update) --------------------------------------------------------
    def init_server_state(self, params: Tensor) -> StateDict:
        return {} if self.per_client else {"last_update": torch.zeros_like(params)}

    def update_server_state(self, server_state: StateDict, summary: RoundSummary) -> StateDict:
        return {"last_update": torch.sub(summary.new_params, summary.old_params)}
