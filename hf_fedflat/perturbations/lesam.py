"""LESAM: SAM whose perturbation is the locally estimated global one, at the cost of one pass per step.

Reference: Fan et al., "Locally Estimated Global Perturbations are Better than Local Perturbations for
Federated Sharpness-aware Minimization", ICML 2024 (FedLESAM).
"""

from __future__ import annotations

import torch

from ..algorithms.base import EPS, ClientContext, GradFn, LocalResult, Perturbation, RoundSummary, StateDict, Tensor, global_norm
from ..algorithms.registry import register_perturbation
from .. import vectors

PER_CLIENT, LAST_GLOBAL_UPDATE = "per_client", "last_global_update"


@register_perturbation
class LESAMPerturbation(Perturbation):
    """``e_i = rho * (w_old_i - w^t) / ||w_old_i - w^t||``, fixed for the round; ``d = grad F_i(w + e_i; B)``.

    ``w_old_i`` (default, the paper) is the global model client i received the last time it took part,
    kept as client state ``{"w_old"}`` in the client-state store (which spills to disk past its memory
    budget). With ``direction="last_global_update"`` (the public code) every client uses
    ``w^{t-1} - w^t``, kept by this piece's server half and broadcast. Without an estimate (first
    participation, round 0, or a zero difference) the step is plain ERM. One forward and backward per
    step; the reported loss is the loss at the perturbed point (the loss at ``w`` would cost a pass).
    """

    name = "lesam"
    passes_per_step = 1
    default_rho = 0.05

    def __init__(self, rho: float = 0.05, direction: str = PER_CLIENT):
        if direction not in (PER_CLIENT, LAST_GLOBAL_UPDATE):
            raise ValueError(f"lesam_direction must be {PER_CLIENT!r} or {LAST_GLOBAL_UPDATE!r}, got {direction!r}.")
        self.rho, self.mode = rho, direction

    @classmethod
    def from_args(cls, args) -> "LESAMPerturbation":
        return cls(rho=args.rho, direction=args.lesam_direction)

    def begin(self, ctx: ClientContext) -> dict[str, Tensor | None]:
        if self.mode == PER_CLIENT:
            w_old = ctx.state.get(self.name, {}).get("w_old")
            estimate = None if w_old is None else torch.sub(w_old, ctx.global_params, out=vectors.empty_like(w_old))
        else:
            last_update = ctx.broadcast[self.name]["last_update"]
            estimate = torch.neg(last_update, out=vectors.empty_like(last_update))  # w^{t-1} - w^t
        offset = None
        if estimate is not None:
            norm = global_norm(estimate)
            if torch.isfinite(norm) and norm > 0:
                offset = estimate.mul_(self.rho / (norm + EPS))
        return {"offset": offset}

    def direction(self, grad_at: GradFn, workspace) -> tuple[Tensor, Tensor]:
        return grad_at(workspace["offset"])

    def fixed_offset(self, workspace) -> Tensor | None:
        return workspace["offset"]

    def end(self, ctx: ClientContext, workspace, result: LocalResult) -> tuple[StateDict | None, StateDict]:
        if self.mode == PER_CLIENT:
            return {"w_old": ctx.global_params}, {}
        return None, {}

    # server half (only for last_global_update) --------------------------------------------------------
    def init_server_state(self, params: Tensor) -> StateDict:
        return {"last_update": torch.zeros_like(params)} if self.mode == LAST_GLOBAL_UPDATE else {}

    def update_server_state(self, server_state: StateDict, summary: RoundSummary) -> StateDict:
        return {"last_update": torch.sub(summary.new_params, summary.old_params, out=vectors.empty_like(summary.new_params))}

    def offset_estimate(self, workspace, local_gradient: Tensor | None) -> Tensor | None:
        return workspace["offset"]
