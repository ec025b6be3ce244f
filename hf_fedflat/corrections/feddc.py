"""FedDC's local drift variable (the gradient correction is SCAFFOLD's piece; the server adds the drift).

Reference: Gao et al., "FedDC: Federated Learning with Non-IID Data via Local Drift Decoupling and Correction",
CVPR 2022, Algorithm 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..algorithms.base import (
    DELTA_SHIFT, ClientContext, Correction, LocalResult, PieceConfig, StateDict, Tensor, check_number, hyperparameter,
    register_correction,
)


@dataclass
class FedDCConfig(PieceConfig):
    feddc_alpha: float = hyperparameter(0.01, "FedDC: weight alpha of the drift penalty alpha/2 ||w + h_i - w^t||^2.")

    def validate(self) -> None:
        check_number("feddc_alpha", self.feddc_alpha, low=0.0)


@register_correction
class FedDCDrift(Correction):
    """``d += alpha * (w + h_i - w^t)``, the gradient of ``(alpha/2) ||w + h_i - w^t||^2``; after the round
    ``h_i += w_i - w^t``, and the client sends ``h_i`` (message ``delta_shift``) so that the ``shifted_mean``
    server averages ``w_i + h_i``. Client state ``{"h"}`` (zeros at first).

    FedDC's gradient correction ``<w, g - g_i>/(K eta)`` (its Algorithm 1, the paper's code: SCAFFOLD's option II
    control variates) is the ``scaffold`` piece beside this one in the ``feddc`` preset.
    """

    name = "feddc"
    client_state_keys = ("h",)  # its per-client state (see ClientPiece)
    assumes_plain_sgd = True
    plain_sgd_policy = "warn"
    plain_sgd_reason = "the server adds h_i = sum of w_i - w^t, which assumes the plain-SGD local trajectory of the paper"
    config_class = FedDCConfig

    def begin(self, ctx: ClientContext) -> dict[str, Tensor]:
        h = ctx.state.get(self.name, {}).get("h")
        if h is None:
            h = torch.zeros_like(ctx.global_params)
        return {"h": h, "shift": torch.sub(h, ctx.global_params)}  # alpha*w + alpha*(h - w^t)

    def correct(self, D, W, ws):
        alpha = self.config.feddc_alpha
        return D + alpha * W + alpha * ws["shift"]

    def end(self, ctx: ClientContext, workspace, result: LocalResult) -> tuple[StateDict, StateDict]:
        h = torch.add(workspace["h"], result.delta)
        return {"h": h}, {DELTA_SHIFT: h}
