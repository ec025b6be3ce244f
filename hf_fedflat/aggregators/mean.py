"""FedAvg's server rule."""

import torch

from ..algorithms.base import Aggregator, ClientUpdate, StateDict, Tensor, weighted_delta
from ..algorithms.registry import register_aggregator
from .. import vectors


@register_aggregator
class MeanAggregator(Aggregator):
    """``w^{t+1} = w^t + eta_g * sum_i p_i * Delta_i`` with ``Delta_i = w_i - w^t``."""

    name = "mean"
    linear_in_weighted_delta = True

    def __init__(self, server_learning_rate: float = 1.0):
        self.server_learning_rate = server_learning_rate

    @classmethod
    def from_args(cls, args) -> "MeanAggregator":
        return cls(server_learning_rate=args.server_learning_rate)

    def aggregate(
        self, params: Tensor, updates: list[ClientUpdate], weights: Tensor, state: StateDict
    ) -> tuple[Tensor, StateDict]:
        delta = weighted_delta(updates, weights)
        return torch.add(params, delta, alpha=self.server_learning_rate, out=vectors.empty_like(params)), state
