"""FedSMOO's corrected perturbation: local SAM steered towards the global perturbation.

Reference: Sun et al., "Dynamic Regularized Sharpness Aware Minimization in Federated Learning:
Approaching Global Consistency and Smooth Landscape", ICML 2023 (FedSMOO).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..algorithms.base import (
    EPS, RHO_HELP, ClientContext, GradientOracle, LocalResult, Perturbation, PieceConfig, RoundSummary, SharpnessAware,
    StateDict, Tensor, ascent_offset, check_number, global_norm, hyperparameter, register_perturbation,
)


@dataclass
class SMOOConfig(PieceConfig):
    rho: float = hyperparameter(0.05, RHO_HELP)

    def validate(self) -> None:
        check_number("rho", self.rho, low=0.0)


@register_perturbation
class SMOOPerturbation(Perturbation, SharpnessAware):
    """Per step: ``g_hat = g - mu_i - s``; ``e = rho * g_hat/||g_hat||``; ``mu_i += e - s``; ``d = grad F_i(w+e; B)``.

    Client state ``{"mu"}`` (zeros at first); the message is the client's final ``mu_i``. Server half:
    ``s = rho * mean_{S_t}(mu_i) / ||mean_{S_t}(mu_i)||``, broadcast next round (zeros in round 0). The
    server half lives with the perturbation (not in the ``fedsmoo`` aggregator) so that SMOO composes
    with any aggregator.
    """

    name = "smoo"
    client_state_keys = ("mu",)  # its per-client state (see ClientPiece)
    server_reads_updates = True  # s from each client's mu_i
    passes_per_step = 2
    config_class = SMOOConfig

    def begin(self, ctx: ClientContext) -> dict[str, Tensor]:
        s = ctx.broadcast[self.name]["s"]
        mu = ctx.state.get(self.name, {}).get("mu")
        return {"s": s, "mu": torch.zeros_like(s) if mu is None else mu.clone()}

    def direction(self, grad_at: GradientOracle, workspace) -> tuple[Tensor, Tensor]:
        loss, g = grad_at(None)
        s, mu = workspace["s"], workspace["mu"]
        g_hat = g - mu - s
        e = g_hat.mul_(self.config.rho / (global_norm(g_hat) + EPS))
        workspace["mu"] = mu + e - s
        _, g_perturbed = grad_at(e)
        return loss, g_perturbed

    def drift_offset(self, workspace, local_gradient: Tensor) -> Tensor:
        return ascent_offset(local_gradient, self.config.rho)

    def end(self, ctx: ClientContext, workspace, result: LocalResult) -> tuple[StateDict, StateDict]:
        return {"mu": workspace["mu"]}, {"mu": workspace["mu"]}

    def init_server_state(self, params: Tensor) -> StateDict:
        return {"s": torch.zeros_like(params)}

    def update_server_state(self, server_state: StateDict, summary: RoundSummary) -> StateDict:
        mean_mu = torch.stack([u.messages[self.name]["mu"] for u in summary.updates]).mean(dim=0)
        return {"s": mean_mu.mul_(self.config.rho / (global_norm(mean_mu) + EPS))}
