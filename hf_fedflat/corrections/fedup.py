"""FedUp: clients minimise an upper bound of the global loss built from the last global update.

Reference: FedUp (2024). The local objective is
``F_i(X) + (alpha/eta) (X^{t-1} - X^t)^T (X - X^t) + (alpha/2) ||X - X^t||^2``.
"""

from __future__ import annotations

import torch

from ..algorithms.base import ClientContext, Correction, RoundSummary, StateDict, Tensor
from ..algorithms.registry import register_correction
from .. import vectors


@register_correction
class FedUpCorrection(Correction):
    """``d += (alpha/eta) * (w^{t-1} - w^t) + alpha * (w - w^t)``, the gradient of FedUp's bound.

    ``eta`` is the round's local learning rate. Server half ``{"last_update": w^t - w^{t-1}}``, broadcast
    (zeros in round 0, so the linear term vanishes there). No client state.
    """

    name = "fedup"

    def __init__(self, alpha: float = 0.01):
        self.alpha = alpha

    @classmethod
    def from_args(cls, args) -> "FedUpCorrection":
        return cls(alpha=args.fedup_alpha)

    def begin(self, ctx: ClientContext) -> Tensor:
        last_update = ctx.broadcast[self.name]["last_update"]
        # (alpha/eta)(w^{t-1} - w^t) + alpha(w - w^t) = alpha*w - alpha*[w^t + (w^t - w^{t-1})/eta]: the bracket
        # in one pass per client (a negation, a division and a subtraction were three)
        return torch.add(ctx.global_params, last_update, alpha=1.0 / ctx.learning_rate,
                         out=vectors.empty_like(last_update))

    def apply(self, direction: Tensor, params: Tensor | None, workspace, bias_scale: float = 1.0) -> Tensor:
        scale = self.alpha * bias_scale
        return torch.add(direction, params, alpha=scale, out=vectors.empty_like(direction)).add_(workspace, alpha=-scale)

    def apply_to_grads_(self, grads, params, workspace, split, bias_scale: float = 1.0) -> None:
        scale = self.alpha * bias_scale
        torch._foreach_add_(grads, params, alpha=scale)
        torch._foreach_add_(grads, split(workspace), alpha=-scale)

    def init_server_state(self, params: Tensor) -> StateDict:
        return {"last_update": torch.zeros_like(params)}

    def update_server_state(self, server_state: StateDict, summary: RoundSummary) -> StateDict:
        return {"last_update": torch.sub(summary.new_params, summary.old_params, out=vectors.empty_like(summary.new_params))}
