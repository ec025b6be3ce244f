"""FedAdam, the adaptive server optimizer of FedOpt.

Reference: Reddi et al., "Adaptive Federated Optimization", ICLR 2021.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..algorithms.base import (
    SERVER_LEARNING_RATE_HELP, Aggregator, Capabilities, ClientUpdate, PieceConfig, StateDict, Tensor, check_choice,
    check_number, fail, hyperparameter, register_aggregator, weighted_delta,
)


@dataclass
class FedAdamConfig(PieceConfig):
    # 1.0 as every server rule's: the fedadam preset sets the paper's 0.1 (so --aggregator fedadam under another
    # preset keeps the step size it had)
    server_learning_rate: float = hyperparameter(1.0, SERVER_LEARNING_RATE_HELP)
    server_beta1: float = hyperparameter(0.9, "FedAdam: server first-moment decay b1 (0.9).")
    server_beta2: float = hyperparameter(0.99, "FedAdam: server second-moment decay b2 (0.99).")
    server_tau: float = hyperparameter(1e-2, "FedAdam: adaptivity tau in m/(sqrt(v)+tau) (1e-2).")
    server_v_init: str = hyperparameter(
        "tau_squared", "FedAdam: the second moment's start, 'tau_squared' (v_{-1} = tau^2, Reddi et al. Alg. 2: "
        "v_{-1} >= tau^2) or 'zero' (v = 0, the FL-Simulator code).")

    def validate(self) -> None:
        check_choice("server_v_init", self.server_v_init, ("tau_squared", "zero"))
        check_number("server_learning_rate", self.server_learning_rate, low=0.0, low_open=True)
        check_number("server_tau", self.server_tau, low=0.0)
        for name in ("server_beta1", "server_beta2"):
            check_number(name, getattr(self, name), low=0.0)
            if getattr(self, name) >= 1:
                fail(name, f"must be in [0, 1), got {getattr(self, name)}.")


@register_aggregator
class FedAdamAggregator(Aggregator):
    """``Delta = sum p_i Delta_i``; ``m = b1 m + (1-b1) Delta``; ``v = b2 v + (1-b2) Delta^2``;
    ``w += eta_g * m / (sqrt(v) + tau)``. No bias correction (as in the paper). State ``{"m", "v"}``; ``m`` starts
    at 0 and ``v`` at ``tau^2`` (the paper's ``v_{-1} >= tau^2``) or, with ``server_v_init="zero"``, at 0."""

    name = "fedadam"
    config_class = FedAdamConfig
    capabilities = Capabilities(linear_in_weighted_delta=True)

    def init_state(self, params: Tensor) -> StateDict:
        v = torch.zeros_like(params)
        if self.config.server_v_init == "tau_squared":
            v.fill_(self.config.server_tau ** 2)
        return {"m": torch.zeros_like(params), "v": v}

    def aggregate(
        self, params: Tensor, updates: list[ClientUpdate], weights: Tensor, state: StateDict
    ) -> tuple[Tensor, StateDict]:
        c = self.config
        delta = weighted_delta(updates, weights)
        m = state["m"].mul(c.server_beta1).add_(delta, alpha=1 - c.server_beta1)
        v = state["v"].mul(c.server_beta2).addcmul_(delta, delta, value=1 - c.server_beta2)
        step = m / v.sqrt().add_(c.server_tau)
        return params.add(step, alpha=c.server_learning_rate), {"m": m, "v": v}
