"""The mean of what clients send when they send their weights shifted by a client variable (FedDC, FedSpeed)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..algorithms.base import (
    DELTA_SHIFT, Aggregator, ClientUpdate, PieceConfig, StateDict, Tensor, check_number, hyperparameter,
    register_aggregator,
)


@dataclass
class ShiftedMeanConfig(PieceConfig):
    server_learning_rate: float = hyperparameter(1.0, "Server learning rate eta_g: w <- w + eta_g * sum_i p_i (w_i - w).")

    def validate(self) -> None:
        check_number("server_learning_rate", self.server_learning_rate, low=0.0, low_open=True)


@register_aggregator
class ShiftedMeanAggregator(Aggregator):
    """``w^{t+1} = w^t + eta_g * sum_i p_i (Delta_i + s_i)``, ``s_i`` the sum of the ``delta_shift`` messages of
    client i's pieces (FedDC: ``h_i``, so the server averages ``w_i + h_i``; FedSpeed: ``-lambda g_hat_i``, so it
    averages ``x_hat_i = w_i - lambda g_hat_i``). ``Delta_i`` itself stays the client's own update for every other
    server half (SCAFFOLD's ``c``). Without shifts it is ``mean``."""

    name = "shifted_mean"
    config_class = ShiftedMeanConfig

    def aggregate(
        self, params: Tensor, updates: list[ClientUpdate], weights: Tensor, state: StateDict
    ) -> tuple[Tensor, StateDict]:
        step = torch.zeros_like(params)
        for update, weight in zip(updates, weights.tolist()):
            step.add_(update.delta, alpha=weight)
            for message in update.messages.values():
                shift = message.get(DELTA_SHIFT)
                if shift is not None:
                    step.add_(shift.to(step.device, step.dtype), alpha=weight)
        return torch.add(params, step, alpha=self.config.server_learning_rate), state
