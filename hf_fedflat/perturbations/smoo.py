"""FedSMOO's corrected perturbation: local SAM steered towards the global perturbation.

Reference: Sun et al., "Dynamic Regularized Sharpness Aware Minimization in Federated Learning:
Approaching Global Consistency and Smooth Landscape", ICML 2023 (FedSMOO).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..algorithms.base import (
    EPS, RHO_HELP, ClientContext, GradFn, LocalResult, Perturbation, RoundSummary, SharpnessAware, StateDict, Tensor,
    ascent_offset, global_norm,
)
from ..algorithms.device_checks import checked_norm, select, usable_offset
from ..algorithms.hyperparameters import PieceConfig, check_number, hyperparameter
from ..algorithms.registry import register_perturbation


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
    passes_per_step = 2
    config_class = SMOOConfig

    def begin(self, ctx: ClientContext) -> dict[str, Tensor]:
        s = ctx.broadcast[self.name]["s"]
        mu = ctx.state.get(self.name, {}).get("mu")
        return {"s": s, "mu": torch.zeros_like(s) if mu is None else mu.clone()}

    def direction(self, grad_at: GradFn, workspace) -> tuple[Tensor, Tensor]:
        loss, grad = grad_at(None)
        s, mu = workspace["s"], workspace["mu"]
        corrected = grad - mu - s
        norm, ok = checked_norm(corrected)
        if ok is False:
            return loss, grad
        offset = usable_offset(corrected.mul_(self.config.rho / (norm + EPS)), ok)
        if ok is True:
            mu.add_(offset).sub_(s)
        else:  # (on the device: mu moves only on a usable step, as with the host test)
            mu.copy_(torch.where(ok, mu + offset - s, mu))
        _, perturbed_grad = grad_at(offset)
        return loss, select(ok, perturbed_grad, grad)

    def drift_offset(self, workspace, local_gradient: Tensor) -> Tensor:
        return ascent_offset(local_gradient, self.config.rho)

    def end(self, ctx: ClientContext, workspace, result: LocalResult) -> tuple[StateDict, StateDict]:
        return {"mu": workspace["mu"]}, {"mu": workspace["mu"]}

    def init_server_state(self, params: Tensor) -> StateDict:
        return {"s": torch.zeros_like(params)}

    def update_server_state(self, server_state: StateDict, summary: RoundSummary) -> StateDict:
        mean_mu = torch.stack([u.messages[self.name]["mu"] for u in summary.updates]).mean(dim=0)
        return {"s": mean_mu.mul_(self.config.rho / (global_norm(mean_mu) + EPS))}
