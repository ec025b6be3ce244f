"""FedGloSS's client half: the ADMM terms of the local step and the client's dual ``sigma_k``.

Reference: Caldarola et al., "Beyond Local Sharpness: Communication-Efficient Global Sharpness-aware Minimization for
Federated Learning", CVPR 2025 (FedGloSS). The server half is ``hf_fedflat/aggregators/fedgloss.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..algorithms.base import (
    ClientContext, Correction, LocalResult, PieceConfig, StateDict, Tensor, check_number, hyperparameter,
    register_correction,
)

FEDGLOSS_BETA_HELP = ("FedGloSS: ADMM penalty beta: clients add (w - w~)/beta - sigma_k to the step, the server "
                      "subtracts beta*sigma from w.")


@dataclass
class FedGloSSConfig(PieceConfig):
    fedgloss_beta: float = hyperparameter(10.0, FEDGLOSS_BETA_HELP)

    def validate(self) -> None:
        check_number("fedgloss_beta", self.fedgloss_beta, low=0.0, low_open=True)


@register_correction
class FedGloSSCorrection(Correction):
    """``d += (w - w~)/beta - sigma_k`` with ``w~`` the weights the client received (the server's ascent point);
    after the round ``sigma_k <- sigma_k - (w_k - w~)/beta``.

    The gradient of the augmented Lagrangian ``<sigma_k, w~ - w> + ||w - w~||^2/(2 beta)`` of the consensus
    constraint ``w = w~``: any perturbation gives the step's first term (FedGloSS: SAM). Client state:
    ``{"sigma"}`` (zeros before the first participation); no message: the server's dual follows from the deltas.
    """

    name = "fedgloss"
    client_state_keys = ("sigma",)
    config_class = FedGloSSConfig

    def begin(self, ctx: ClientContext) -> dict[str, Tensor]:
        sigma = ctx.state.get(self.name, {}).get("sigma")
        return {"sigma": torch.zeros_like(ctx.global_params) if sigma is None else sigma,
                "received": ctx.global_params}

    def correct(self, D, W, ws):
        inverse_beta = 1.0 / self.config.fedgloss_beta
        return D - ws["sigma"] + inverse_beta * W - inverse_beta * ws["received"]

    def end(self, ctx: ClientContext, workspace, result: LocalResult) -> tuple[StateDict, StateDict]:
        # sigma_k - (w_k - w~)/beta, w_k - w~ being the delta the client sends
        return {"sigma": torch.sub(workspace["sigma"], result.delta, alpha=1.0 / self.config.fedgloss_beta)}, {}
