"""FedUp: clients minimise an upper bound of the global loss built from the last global update.

Reference: FedUp (2024). The local objective is
``F_i(X) + (alpha/eta) (X^{t-1} - X^t)^T (X - X^t) + (alpha/2) ||X - X^t||^2``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..algorithms.base import (
    ClientContext, Correction, PieceConfig, RoundSummary, StateDict, Tensor, check_choice, check_number,
    hyperparameter, register_correction,
)


@dataclass
class FedUpConfig(PieceConfig):
    fedup_alpha: float = hyperparameter(
        0.01, "FedUp: alpha in (alpha/eta)(w^{t-1} - w^t) + alpha*(w - w^t), the upper-bound terms.")
    fedup_eta: str = hyperparameter(
        "round",
        "FedUp: the eta of alpha/eta, 'round' (the round's local lr eta_t = learning_rate * lr_decay_per_round^t) or "
        "'constant' (learning_rate, the paper's constant eta; the fedup preset's default).")

    def validate(self) -> None:
        check_number("fedup_alpha", self.fedup_alpha, low=0.0)
        check_choice("fedup_eta", self.fedup_eta, ("round", "constant"))


@register_correction
class FedUpCorrection(Correction):
    """``d += (alpha/eta) * (w^{t-1} - w^t) + alpha * (w - w^t)``, the gradient of FedUp's bound.

    ``eta`` is the round's local learning rate (``fedup_eta="round"``) or the run's ``learning_rate`` whatever the
    decay (``"constant"``: the paper, whose eta is constant; equal without ``lr_decay_per_round``). Server half ``{"last_update": w^t - w^{t-1}}``, broadcast
    (zeros in round 0, so the linear term vanishes there). No client state.
    """

    name = "fedup"
    #: hf_fedflat.algorithms.optimizers: refused ("error") or warned ("warn") with another local optimizer
    assumes_plain_sgd = True
    plain_sgd_policy = "warn"
    plain_sgd_reason = (
        "the (alpha/eta)(w^{t-1} - w^t) term takes the local learning rate as the SGD step size of the bound"
    )
    config_class = FedUpConfig
    run_settings = ("learning_rate",)

    def __init__(self, config: FedUpConfig | None = None, learning_rate: float | None = None):
        super().__init__(config)
        self.learning_rate = learning_rate

    def begin(self, ctx: ClientContext) -> Tensor:
        last_update = ctx.broadcast[self.name]["last_update"]
        eta = ctx.learning_rate
        if self.config.fedup_eta == "constant":
            if self.learning_rate is None:
                raise ValueError("fedup_eta: 'constant' needs the run's learning_rate (build the piece with it).")
            eta = self.learning_rate
        # (alpha/eta)(w^{t-1} - w^t) + alpha(w - w^t) = alpha*w - alpha*[w^t + (w^t - w^{t-1})/eta]: the bracket
        # in one pass per client (a negation, a division and a subtraction were three)
        return torch.add(ctx.global_params, last_update, alpha=1.0 / eta)

    def correct(self, D, W, anchor):
        alpha = self.config.fedup_alpha
        return D + alpha * W - alpha * anchor

    def init_server_state(self, params: Tensor) -> StateDict:
        return {"last_update": torch.zeros_like(params)}

    def update_server_state(self, server_state: StateDict, summary: RoundSummary) -> StateDict:
        return {"last_update": torch.sub(summary.new_params, summary.old_params)}
