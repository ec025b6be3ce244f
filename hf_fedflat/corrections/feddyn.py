"""FedDyn's dynamic regulariser (client half; the server rule is the ``feddyn`` aggregator).

Reference: Acar et al., "Federated Learning Based on Dynamic Regularization", ICLR 2021.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..algorithms.base import (
    ClientContext, Correction, LocalResult, PieceConfig, StateDict, Tensor, check_number, hyperparameter,
    register_correction,
)

@dataclass
class FedDynConfig(PieceConfig):
    feddyn_alpha: float = hyperparameter(0.1, "FedDyn / FedSMOO / FedLESAM-D: weight alpha of the dynamic regulariser.")

    def validate(self) -> None:
        check_number("feddyn_alpha", self.feddyn_alpha, low=0.0)


@register_correction
class FedDynCorrection(Correction):
    """``d += alpha * (w - w^t) + alpha * h_i``; after the round ``h_i += w_i - w^t``.

    ``-alpha * h_i`` is the client's linear term ``grad L_i`` of FedDyn's local objective
    ``L_i(w) - <grad L_i(w_i^{t-1}), w> + (alpha/2) ||w - w^t||^2``. Client state ``{"h"}`` (zeros at first).
    """

    name = "feddyn"
    client_state_keys = ("h",)  # its per-client state (see ClientPiece)
    #: hf_fedflat.algorithms.optimizers: refused ("error") or warned ("warn") with another local optimizer
    assumes_plain_sgd = True
    plain_sgd_policy = "warn"
    plain_sgd_reason = (
        "h_i += w_i - w^t equals -grad L_i(w_i)/alpha only at the local objective's stationary point, which "
        "the paper reaches with plain SGD; other optimizers stop elsewhere after K steps and h_i drifts"
    )
    config_class = FedDynConfig

    def begin(self, ctx: ClientContext) -> dict[str, Tensor]:
        h = ctx.state.get(self.name, {}).get("h")
        if h is None:
            h = torch.zeros_like(ctx.global_params)
        # alpha*(w - w^t) + alpha*h = alpha*w + alpha*(h - w^t): one constant vector per round
        return {"h": h, "shift": torch.sub(h, ctx.global_params)}

    def correct(self, D, W, ws):
        alpha = self.config.feddyn_alpha
        return D + alpha * W + alpha * ws["shift"]

    def end(self, ctx: ClientContext, workspace, result: LocalResult) -> tuple[StateDict, StateDict]:
        return {"h": torch.add(workspace["h"], result.delta)}, {}
