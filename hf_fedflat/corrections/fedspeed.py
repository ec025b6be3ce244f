"""FedSpeed's prox-correction (the merged SAM gradient is the ``fedspeed_sam`` perturbation).

Reference: Sun et al., "FedSpeed: Larger Local Interval, Less Communication Round, and Higher Generalization
Accuracy", ICLR 2023, Algorithm 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..algorithms.base import (
    DELTA_SHIFT, ClientContext, Correction, LocalResult, PieceConfig, StateDict, Tensor, check_number, hyperparameter,
    register_correction,
)


@dataclass
class FedSpeedConfig(PieceConfig):
    fedspeed_lambda: float = hyperparameter(
        10.0, "FedSpeed: lambda of the prox term (1/(2 lambda)) ||w - w^t||^2 and of the sent x_i - lambda g_hat_i.")

    def validate(self) -> None:
        check_number("fedspeed_lambda", self.fedspeed_lambda, low=0.0, low_open=True)


@register_correction
class FedSpeedCorrection(Correction):
    """``d += -g_hat_i + (1/lambda) (w - w^t)`` (Alg. 1 line 9); after the round ``g_hat_i <- g_hat_i - (1/lambda)
    (w_i - w^t)`` (line 11), and the client sends ``x_hat_i = w_i - lambda g_hat_i`` (line 12): the message
    ``delta_shift = -lambda g_hat_i`` that the ``shifted_mean`` server adds to ``Delta_i``. Client state
    ``{"g_hat"}`` (zeros at first).
    """

    name = "fedspeed"
    client_state_keys = ("g_hat",)  # its per-client state (see ClientPiece)
    assumes_plain_sgd = True
    plain_sgd_policy = "warn"
    plain_sgd_reason = "g_hat_i -= (w_i - w^t)/lambda is the prox-correction of the paper's plain-SGD local steps"
    config_class = FedSpeedConfig

    def begin(self, ctx: ClientContext) -> dict[str, Tensor]:
        g_hat = ctx.state.get(self.name, {}).get("g_hat")
        if g_hat is None:
            g_hat = torch.zeros_like(ctx.global_params)
        # -g_hat + (w - w^t)/lambda = (1/lambda) w - (g_hat + w^t/lambda): one constant vector per round
        return {"g_hat": g_hat, "anchor": torch.add(g_hat, ctx.global_params, alpha=1.0 / self.config.fedspeed_lambda)}

    def correct(self, D, W, ws):
        inverse = 1.0 / self.config.fedspeed_lambda
        return D + inverse * W - ws["anchor"]

    def end(self, ctx: ClientContext, workspace, result: LocalResult) -> tuple[StateDict, StateDict]:
        lam = self.config.fedspeed_lambda
        g_hat = torch.sub(workspace["g_hat"], result.delta, alpha=1.0 / lam)
        return {"g_hat": g_hat}, {DELTA_SHIFT: torch.mul(g_hat, -lam)}
