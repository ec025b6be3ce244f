"""Client momentum from the last global update (MoFedSAM, after FedCM).

References: Qu et al., "Generalized Federated Learning via Sharpness Aware Minimization", ICML 2022
(MoFedSAM); Xu et al., "FedCM: Federated Learning with Client-level Momentum", 2021.
"""

from __future__ import annotations

import torch

from ..algorithms.base import ClientContext, Correction, RoundSummary, StateDict, Tensor, weighted_delta
from ..algorithms.registry import register_correction
from .. import vectors


@register_correction
class MomentumCorrection(Correction):
    """``d <- a * d + (1 - a) * m`` with ``m = -(sum_i p_i Delta_i^{t-1}) / (K * eta_{t-1})``.

    ``m`` is the previous round's average update per local step, as a gradient; the server half computes
    it (``K`` = weighted mean of the local steps) and broadcasts it. In round 0 there is no ``m`` yet and
    the direction is left unchanged (FedCM's code would scale it by ``a`` instead). No client state.
    """

    name = "momentum"
    uses_params = False

    def __init__(self, alpha: float = 0.1):
        self.alpha = alpha

    @classmethod
    def from_args(cls, args) -> "MomentumCorrection":
        return cls(alpha=args.momentum_alpha)

    def begin(self, ctx: ClientContext) -> Tensor | None:
        state = ctx.broadcast[self.name]
        return state["m"] if bool(state["ready"].item()) else None

    def apply(self, direction: Tensor, params: Tensor | None, workspace, bias_scale: float = 1.0) -> Tensor:
        if workspace is None:
            return direction
        return torch.mul(direction, self.alpha, out=vectors.empty_like(direction)).add_(workspace, alpha=(1 - self.alpha) * bias_scale)

    def apply_to_grads_(self, grads, params, workspace, split, bias_scale: float = 1.0) -> None:
        if workspace is None:
            return
        torch._foreach_mul_(grads, self.alpha)
        torch._foreach_add_(grads, split(workspace), alpha=(1 - self.alpha) * bias_scale)

    def init_server_state(self, params: Tensor) -> StateDict:
        return {"m": torch.zeros_like(params), "ready": torch.zeros(1)}

    def update_server_state(self, server_state: StateDict, summary: RoundSummary) -> StateDict:
        weights = summary.weights.tolist()
        steps = sum(w * u.num_steps for w, u in zip(weights, summary.updates))
        if steps <= 0 or summary.learning_rate <= 0:
            return server_state
        m = weighted_delta(summary.updates, summary.weights).div_(-steps * summary.learning_rate)
        return {"m": m, "ready": torch.ones(1)}
