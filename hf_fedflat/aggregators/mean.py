"""FedAvg's server rule."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..algorithms.base import (
    SERVER_LEARNING_RATE_HELP, Aggregator, Capabilities, ClientUpdate, PieceConfig, StateDict, Tensor, check_number,
    hyperparameter, register_aggregator, weighted_delta,
)


@dataclass
class MeanConfig(PieceConfig):
    server_learning_rate: float = hyperparameter(1.0, SERVER_LEARNING_RATE_HELP)

    def validate(self) -> None:
        check_number("server_learning_rate", self.server_learning_rate, low=0.0, low_open=True)


@register_aggregator
class MeanAggregator(Aggregator):
    """``w^{t+1} = w^t + eta_g * sum_i p_i * Delta_i`` with ``Delta_i = w_i - w^t``."""

    name = "mean"
    config_class = MeanConfig
    capabilities = Capabilities(linear_in_weighted_delta=True)

    def aggregate(
        self, params: Tensor, updates: list[ClientUpdate], weights: Tensor, state: StateDict
    ) -> tuple[Tensor, StateDict]:
        delta = weighted_delta(updates, weights)
        return torch.add(params, delta, alpha=self.config.server_learning_rate), state
