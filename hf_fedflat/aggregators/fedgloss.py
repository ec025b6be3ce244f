"""FedGloSS's server rule: a SAM step on the server, with the previous pseudo-gradient as its ascent direction, and
the ADMM dual ``sigma``.

Reference: Caldarola et al., "Beyond Local Sharpness: Communication-Efficient Global Sharpness-aware Minimization for
Federated Learning", CVPR 2025 (FedGloSS). The client half is ``hf_fedflat/corrections/fedgloss.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..algorithms.base import (
    EPS, RHO_START_HELP, RHO_WARMUP_HELP, SERVER_LEARNING_RATE_HELP, Aggregator, ClientUpdate, PieceConfig,
    StateDict, Tensor, check_integer, check_number, global_norm, hyperparameter, ramped_radius, register_aggregator,
    weighted_delta,
)


@dataclass
class FedGloSSServerConfig(PieceConfig):
    fedgloss_rho: float = hyperparameter(
        0.15, "FedGloSS: radius of the server's ascent step w~ = w + rho * Delta^{t-1}/||Delta^{t-1}|| (CIFAR-10 0.15, "
        "CIFAR-100 0.01).")
    fedgloss_beta: float = hyperparameter(
        10.0, "FedGloSS: ADMM penalty beta: clients add (w - w~)/beta - sigma_k to the step, the server subtracts "
        "beta*sigma from w.")
    rho_start: float = hyperparameter(0.001, RHO_START_HELP)
    rho_warmup_rounds: int = hyperparameter(2000, RHO_WARMUP_HELP)
    server_learning_rate: float = hyperparameter(1.0, SERVER_LEARNING_RATE_HELP)

    def validate(self) -> None:
        check_number("fedgloss_rho", self.fedgloss_rho, low=0.0)
        check_number("fedgloss_beta", self.fedgloss_beta, low=0.0, low_open=True)
        check_number("rho_start", self.rho_start, low=0.0)
        check_integer("rho_warmup_rounds", self.rho_warmup_rounds, low=0)
        check_number("server_learning_rate", self.server_learning_rate, low=0.0, low_open=True)


@register_aggregator
class FedGloSSAggregator(Aggregator):
    """Sends ``w~ = w + rho_t * Delta^{t-1}/||Delta^{t-1}||`` (``w`` itself while ``Delta`` is zero: round 0), keeps
    ``w``; after the round, with ``Delta_k = w_k - w~`` the clients' deltas and ``S_t`` the clients aggregated::

        sigma   <- sigma - (1/(beta |S_t|)) sum_k Delta_k        (each client's own delta, uniform)
        Delta^t  = -sum_k p_k Delta_k                            (the pseudo-gradient, measured at w~)
        w^{t+1}  = w - eta_s Delta^t - beta sigma                (applied to the unperturbed w)

    ``rho_t`` ramps from ``rho_start`` to ``fedgloss_rho`` over ``rho_warmup_rounds`` rounds. State:
    ``{"sigma", "pseudo_gradient"}``. ``sigma`` sums each client's own delta (``update.client_delta``), also when a
    plug-in in front (FedGH) hands this rule harmonized ones, so it stays the mean of the duals the clients keep.
    """

    name = "fedgloss"
    config_class = FedGloSSServerConfig

    def init_state(self, params: Tensor) -> StateDict:
        return {"sigma": torch.zeros_like(params), "pseudo_gradient": torch.zeros_like(params)}

    def broadcast_weights(self, round_index: int, params: Tensor, state: StateDict) -> Tensor:
        config = self.config
        rho = ramped_radius(config.fedgloss_rho, config.rho_start, config.rho_warmup_rounds, round_index)
        pseudo_gradient = state["pseudo_gradient"]
        norm = global_norm(pseudo_gradient)
        if float(norm) == 0.0:  # round 0 (no pseudo-gradient yet): no ascent step
            return params
        return params.add(pseudo_gradient, alpha=rho / (float(norm) + EPS))

    def aggregate(
        self, params: Tensor, updates: list[ClientUpdate], weights: Tensor, state: StateDict
    ) -> tuple[Tensor, StateDict]:
        beta = self.config.fedgloss_beta
        deviation = torch.zeros_like(params)
        for update in updates:
            deviation.add_(update.client_delta)
        sigma = state["sigma"].sub(deviation, alpha=1.0 / (beta * len(updates)))
        pseudo_gradient = weighted_delta(updates, weights).neg_()
        new_params = params.sub(pseudo_gradient, alpha=self.config.server_learning_rate).sub_(sigma, alpha=beta)
        return new_params, {"sigma": sigma, "pseudo_gradient": pseudo_gradient}
