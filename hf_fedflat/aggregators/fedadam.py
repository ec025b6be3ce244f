"""FedAdam, the adaptive server optimizer of FedOpt.

Reference: Reddi et al., "Adaptive Federated Optimization", ICLR 2021.
"""

from __future__ import annotations

import torch

from ..algorithms.base import Aggregator, ClientUpdate, StateDict, Tensor, weighted_delta
from ..algorithms.registry import register_aggregator


@register_aggregator
class FedAdamAggregator(Aggregator):
    """``Delta = sum p_i Delta_i``; ``m = b1 m + (1-b1) Delta``; ``v = b2 v + (1-b2) Delta^2``;
    ``w += eta_g * m / (sqrt(v) + tau)``. No bias correction (as in the paper). State ``{"m", "v"}``."""

    name = "fedadam"
    linear_in_weighted_delta = True

    def __init__(self, server_learning_rate: float = 0.1, beta1: float = 0.9, beta2: float = 0.99, tau: float = 1e-2):
        self.server_learning_rate, self.beta1, self.beta2, self.tau = server_learning_rate, beta1, beta2, tau

    @classmethod
    def from_args(cls, args) -> "FedAdamAggregator":
        return cls(args.server_learning_rate, args.server_beta1, args.server_beta2, args.server_tau)

    def init_state(self, params: Tensor) -> StateDict:
        return {"m": torch.zeros_like(params), "v": torch.zeros_like(params)}

    def aggregate(
        self, params: Tensor, updates: list[ClientUpdate], weights: Tensor, state: StateDict
    ) -> tuple[Tensor, StateDict]:
        delta = weighted_delta(updates, weights)
        m = state["m"].mul(self.beta1).add_(delta, alpha=1 - self.beta1)
        v = state["v"].mul(self.beta2).addcmul_(delta, delta, value=1 - self.beta2)
        step = m / v.sqrt().add_(self.tau)
        return params.add(step, alpha=self.server_learning_rate), {"m": m, "v": v}
