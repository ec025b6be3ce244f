"""FedDyn's and FedSMOO's server rule.

References: Acar et al., ICLR 2021 (FedDyn); Sun et al., ICML 2023 (FedSMOO).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..algorithms.base import (
    SERVER_LEARNING_RATE_HELP, Aggregator, ClientUpdate, PieceConfig, StateDict, Tensor, check_number, hyperparameter,
    register_aggregator, weighted_delta,
)


@dataclass
class FedDynServerConfig(PieceConfig):
    feddyn_alpha: float = hyperparameter(0.1, "FedDyn / FedSMOO / FedLESAM-D: weight alpha of the dynamic regulariser.")
    server_learning_rate: float = hyperparameter(1.0, SERVER_LEARNING_RATE_HELP)

    def validate(self) -> None:
        check_number("feddyn_alpha", self.feddyn_alpha, low=0.0)
        check_number("server_learning_rate", self.server_learning_rate, low=0.0, low_open=True)


@register_aggregator
class FedDynAggregator(Aggregator):
    """``w^{t+1} = sum_{S_t} p_i w_i + (1/N) sum_{all i} h_i`` with ``h_i += w_i - w^t`` for the sampled clients.

    The server keeps ``H = sum_i h_i`` (state ``{"h_sum"}``) from the deltas it receives, so it needs no
    message from the ``feddyn`` correction, which keeps its own ``h_i`` on the client; this equals FedDyn's
    ``mean(w_i) - h/alpha`` form. With ``alpha = 0`` the regulariser is off and the rule is FedAvg's (the
    ``h/alpha`` form's limit), which keeps ``alpha`` a continuous knob. Hyperparameters: the correction's
    (``feddyn_alpha``) and the server learning rate ``eta_g``, which scales the server's whole step:
    ``w^{t+1} = w^t + eta_g * (sum p_i Delta_i + H/N)`` (FedDyn itself has none: 1, the default). ``N`` is the
    run's ``num_clients``.

    ``H`` sums each client's own delta (``update.client_delta``), also when a plug-in in front (FedGH) hands this
    rule harmonized ones: ``H = sum_i h_i`` with the ``h_i`` the clients keep.
    """

    name = "feddyn"
    config_class = FedDynServerConfig
    run_settings = ("num_clients",)

    def __init__(self, config: FedDynServerConfig | None = None, num_clients: int = 1):
        super().__init__(config)
        self.num_clients = num_clients

    def init_state(self, params: Tensor) -> StateDict:
        return {"h_sum": torch.zeros_like(params)}

    def aggregate(
        self, params: Tensor, updates: list[ClientUpdate], weights: Tensor, state: StateDict
    ) -> tuple[Tensor, StateDict]:
        eta_g = self.config.server_learning_rate
        if eta_g == 1:  # (the same operations as before the server learning rate was read)
            return self._new_params(params, updates, weights, state)
        step, new_state = self._new_params(torch.zeros_like(params), updates, weights, state)
        return params.add(step, alpha=eta_g), new_state

    def _new_params(self, params: Tensor, updates: list[ClientUpdate], weights: Tensor, state: StateDict):
        """``(w^t + sum p_i Delta_i + H/N, {"h_sum": H})``."""
        mean = params.add(weighted_delta(updates, weights))
        if self.config.feddyn_alpha == 0:
            return mean, state
        h_sum = state["h_sum"].clone()
        for update in updates:
            h_sum.add_(update.client_delta)
        return mean.add_(h_sum, alpha=1.0 / self.num_clients), {"h_sum": h_sum}


@register_aggregator
class FedSMOOAggregator(FedDynAggregator):
    """FedSMOO's server: FedDyn's rule. The global perturbation ``s = rho * mean(mu_i)/||mean(mu_i)||`` is the
    server half of the ``smoo`` perturbation, so it follows SMOO into any composition."""

    name = "fedsmoo"
