"""FedNova: normalised averaging that removes the objective inconsistency of unequal local work.

Reference: Wang et al., "Tackling the Objective Inconsistency Problem in Heterogeneous Federated
Optimization", NeurIPS 2020.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..algorithms.base import (
    SERVER_LEARNING_RATE_HELP, Aggregator, ClientUpdate, PieceConfig, StateDict, Tensor, check_number, hyperparameter,
    register_aggregator, weighted_sum,
)


@dataclass
class FedNovaConfig(PieceConfig):
    server_learning_rate: float = hyperparameter(1.0, SERVER_LEARNING_RATE_HELP)

    def validate(self) -> None:
        check_number("server_learning_rate", self.server_learning_rate, low=0.0, low_open=True)


@register_aggregator
class FedNovaAggregator(Aggregator):
    """``tau_eff = sum p_i a_i``; ``w^{t+1} = w^t + eta_g * sum p_i (tau_eff / a_i) Delta_i``.

    ``a_i`` is the client's number of local steps (plain SGD without momentum). Clients that took no step
    have ``Delta_i = 0`` and are left out of ``tau_eff``. Hyperparameter: ``server_learning_rate`` (as the mean's).
    """

    name = "fednova"
    #: hf_fedflat.algorithms.optimizers: refused ("error") or warned ("warn") with another local optimizer
    assumes_plain_sgd = True
    plain_sgd_policy = "warn"
    plain_sgd_reason = (
        "its normalizer a_i is the number of local steps, FedNova's a_i for plain SGD; with momentum rho the "
        "paper's a_i is (K - rho(1-rho^K)/(1-rho))/(1-rho), and adaptive optimizers have none"
    )
    config_class = FedNovaConfig

    def aggregate(
        self, params: Tensor, updates: list[ClientUpdate], weights: Tensor, state: StateDict
    ) -> tuple[Tensor, StateDict]:
        p = weights.tolist()
        tau_eff = sum(w * u.num_steps for w, u in zip(p, updates))
        scaled = weights.new_tensor([w * tau_eff / u.num_steps if u.num_steps else 0.0 for w, u in zip(p, updates)])
        return params.add(weighted_sum([u.delta for u in updates], scaled), alpha=self.config.server_learning_rate), state
