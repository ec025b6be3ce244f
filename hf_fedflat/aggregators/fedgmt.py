"""FedGMT's server rule: the weighted average of the clients' models plus the mean of their duals.

Reference: Li et al., "One Arrow, Two Hawks: Sharpness-aware Minimization for Federated Learning via Global Model
Trajectory" (FedGMT), ICML 2025.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..algorithms.base import (
    Aggregator, ClientUpdate, PieceConfig, StateDict, Tensor, check_choice, hyperparameter, register_aggregator,
    weighted_delta,
)

ALL_CLIENTS, SAMPLED = "all_clients", "sampled"
DUAL_AVERAGES = (ALL_CLIENTS, SAMPLED)
DUAL_AVERAGE_HELP = (
    "FedGMT server: w^{t+1} = sum_S p_m w_m + (1/M) sum d_m over all M clients ('all_clients', the paper and its "
    "code) or the mean of the sampled clients' d_m ('sampled'; each sampled client then sends its d_m).")


@dataclass
class FedGMTServerConfig(PieceConfig):
    fedgmt_dual_average: str = hyperparameter(ALL_CLIENTS, DUAL_AVERAGE_HELP)

    def validate(self) -> None:
        check_choice("fedgmt_dual_average", self.fedgmt_dual_average, DUAL_AVERAGES)


@register_aggregator
class FedGMTAggregator(Aggregator):
    """``d_m += w_m - w^t`` for the sampled clients; ``w^{t+1} = sum_{S_t} p_m w_m + (1/M) sum_{all M} d_m``.

    The server keeps ``D = sum_m d_m`` (state ``{"dual_sum"}``) from the deltas it receives (each client's own,
    ``update.client_delta``, also behind a plug-in such as FedGH), so it needs no message from the ``fedgmt``
    correction, which keeps its own ``d_m``. With ``fedgmt_dual_average="sampled"`` the second term is the mean of
    the sampled clients' ``d_m`` instead (the correction then sends its ``d_m``). ``M`` is the run's
    ``num_clients``. The moving average of the global models is the correction's server half.
    """

    name = "fedgmt"
    config_class = FedGMTServerConfig
    run_settings = ("num_clients",)

    def __init__(self, config: FedGMTServerConfig | None = None, num_clients: int = 1):
        super().__init__(config)
        self.num_clients = num_clients

    def init_state(self, params: Tensor) -> StateDict:
        return {"dual_sum": torch.zeros_like(params)}

    def aggregate(
        self, params: Tensor, updates: list[ClientUpdate], weights: Tensor, state: StateDict
    ) -> tuple[Tensor, StateDict]:
        mean = params.add(weighted_delta(updates, weights))
        dual_sum = state["dual_sum"].clone()
        for update in updates:
            dual_sum.add_(update.client_delta)
        if self.config.fedgmt_dual_average == ALL_CLIENTS:
            return mean.add_(dual_sum, alpha=1.0 / self.num_clients), {"dual_sum": dual_sum}
        duals = [update.messages[self.name]["dual"] for update in updates]
        return mean.add_(torch.stack(duals).mean(dim=0)), {"dual_sum": dual_sum}
