"""FedUp: clients minimise an upper bound of the global loss built from the last global update.

Reference: FedUp (2024). The local objective is
``F_i(X) + (alpha/eta) (X^{t-1} - X^t)^T (X - X^t) + (alpha/2) ||X - X^t||^2``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..algorithms.base import ClientContext, Correction, RoundSummary, StateDict, Tensor
from ..algorithms.hyperparameters import PieceConfig, check_number, hyperparameter
from ..algorithms.registry import register_correction


@dataclass
class FedUpConfig(PieceConfig):
    fedup_alpha: float = hyperparameter(
        0.01, "FedUp: alpha in (alpha/eta)(w^{t-1} - w^t) + alpha*(w - w^t), the upper-bound terms.")

    def validate(self) -> None:
        check_number("fedup_alpha", self.fedup_alpha, low=0.0)


@register_correction
class FedUpCorrection(Correction):
    """``d += (alpha/eta) * (w^{t-1} - w^t) + alpha * (w - w^t)``, the gradient of FedUp's bound.

    ``eta`` is the round's local learning rate. Server half ``{"last_update": w^t - w^{t-1}}``, broadcast
    (zeros in round 0, so the linear term vanishes there). No client state.
    """

    name = "fedup"
    config_class = FedUpConfig

    def begin(self, ctx: ClientContext) -> Tensor:
        last_update = ctx.broadcast[self.name]["last_update"]
        # (alpha/eta)(w^{t-1} - w^t) + alpha(w - w^t) = alpha*w - alpha*[w^t + (w^t - w^{t-1})/eta]: the bracket
        # in one pass per client (a negation, a division and a subtraction were three)
        return torch.add(ctx.global_params, last_update, alpha=1.0 / ctx.learning_rate)

    def correct(self, D, W, anchor):
        alpha = self.config.fedup_alpha
        return D + alpha * W - alpha * anchor

    def init_server_state(self, params: Tensor) -> StateDict:
        return {"last_update": torch.zeros_like(params)}

    def update_server_state(self, server_state: StateDict, summary: RoundSummary) -> StateDict:
        return {"last_update": torch.sub(summary.new_params, summary.old_params)}
