"""Client momentum from the last global update (MoFedSAM, after FedCM).

References: Qu et al., "Generalized Federated Learning via Sharpness Aware Minimization", ICML 2022
(MoFedSAM); Xu et al., "FedCM: Federated Learning with Client-level Momentum", 2021.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..algorithms.base import (
    ClientContext, Correction, PieceConfig, RoundSummary, StateDict, Tensor, check_choice, check_number,
    hyperparameter, register_correction, weighted_delta,
)


@dataclass
class MomentumConfig(PieceConfig):
    momentum_alpha: float = hyperparameter(
        0.1, "MoFedSAM: d <- a*d + (1-a)*m with m the last global update per local step; a (0.1).")
    momentum_first_round: str = hyperparameter(
        "unchanged",
        "MoFedSAM, round 0 (no global update yet): 'unchanged' (d as it is) or 'zero_momentum' (m = 0, so "
        "d <- a*d: FedCM / MoFedSAM's Delta^0 = 0; the mofedsam preset's default).")

    def validate(self) -> None:
        check_number("momentum_alpha", self.momentum_alpha, low=0.0, high=1.0)
        check_choice("momentum_first_round", self.momentum_first_round, ("unchanged", "zero_momentum"))


@register_correction
class MomentumCorrection(Correction):
    """``d <- a * d + (1 - a) * m`` with ``m = -(sum_i p_i Delta_i^{t-1}) / (K * eta_{t-1})``.

    ``m`` is the previous round's average update per local step, as a gradient; the server half computes
    it (``K`` = weighted mean of the local steps) and broadcasts it. In round 0 there is no ``m`` yet: the
    direction is left unchanged (``momentum_first_round="unchanged"``), or ``m = 0`` and ``d <- a*d``
    (``"zero_momentum"``: the papers' ``Delta^0 = 0``). No client state.
    """

    name = "momentum"
    server_reads_updates = True  # m from the raw updates and their local steps
    #: hf_fedflat.algorithms.optimizers: refused ("error") or warned ("warn") with another local optimizer
    assumes_plain_sgd = True
    plain_sgd_policy = "warn"
    plain_sgd_reason = (
        "m = -(sum_i p_i Delta_i)/(K*eta) is the mean local gradient only under plain SGD; with momentum it "
        "is inflated ~1/(1-beta) and with Adam it is not a gradient at all"
    )
    config_class = MomentumConfig

    def begin(self, ctx: ClientContext) -> Tensor | None:
        state = ctx.broadcast[self.name]
        return state["m"] if bool(state["ready"].item()) else None

    def correct(self, D, W, m):
        a = self.config.momentum_alpha
        if m is None:  # round 0: no global update yet
            return a * D if self.config.momentum_first_round == "zero_momentum" else D
        return a * D + (1 - a) * m

    def init_server_state(self, params: Tensor) -> StateDict:
        return {"m": torch.zeros_like(params), "ready": torch.zeros(1)}

    def update_server_state(self, server_state: StateDict, summary: RoundSummary) -> StateDict:
        weights = summary.weights.tolist()
        steps = sum(w * u.num_steps for w, u in zip(weights, summary.updates))
        if steps <= 0 or summary.learning_rate <= 0:
            return server_state
        m = weighted_delta(summary.updates, summary.weights).div_(-steps * summary.learning_rate)
        return {"m": m, "ready": torch.ones(1)}
