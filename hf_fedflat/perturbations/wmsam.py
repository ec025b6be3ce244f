"""FedWMSAM: a momentum-guided global perturbation at one pass per step, mixed with a personalized momentum whose
weight adapts to how well the clients' updates agree with it (client step and server half).

Reference: Li et al., "FedWMSAM: Fast and Flat Federated Learning via Weighted Momentum and Sharpness-Aware Minimization",
NeurIPS 2025 (arXiv 2511.22080).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..algorithms.base import (
    EPS, RHO_HELP, ClientContext, GradientOracle, LocalResult, Perturbation, PieceConfig, RoundSummary, StateDict,
    Tensor, check_number, global_norm, hyperparameter, register_perturbation, weighted_delta,
)

#: alpha <- ALPHA_KEEP * alpha + (1 - ALPHA_KEEP) * clip(mean_k [cos(Delta_k, m) + 1], *ALPHA_RANGE)
ALPHA_KEEP, ALPHA_RANGE = 0.99, (0.1, 0.9)


@dataclass
class WMSAMConfig(PieceConfig):
    rho: float = hyperparameter(0.1, RHO_HELP)
    wmsam_alpha: float = hyperparameter(
        0.1, "FedWMSAM: the starting weight alpha of the perturbed gradient in v = alpha g + (1 - alpha) m_k; the "
             "server then adapts it each round.")

    def validate(self) -> None:
        check_number("rho", self.rho, low=0.0)
        check_number("wmsam_alpha", self.wmsam_alpha, low=0.0, high=1.0, high_open=True)


def shifted_cosine(update: Tensor, momentum: Tensor) -> float:
    """``cos(update, momentum) + 1``, or 0 when either vector is zero (the public code's value then)."""
    norms = float(global_norm(update)) * float(global_norm(momentum))
    return float(torch.dot(update, momentum)) / norms + 1.0 if norms > 0 else 0.0


@register_perturbation
class WMSAMPerturbation(Perturbation):
    """Client ``k`` with the round's ``m``, ``c``, ``alpha`` and its ``c_k``: ``m_k = m + alpha/(1 - alpha) (c - c_k)``;
    at local step ``b`` (from 0), ``delta = (x_r + b m_k) - x_b`` and

    ``g = grad F(x_b + rho delta/||delta||; B)`` (one pass; none: at ``x_b``, as at ``b = 0``),
    ``v = alpha g + (1 - alpha) m_k``.

    The perturbation goes along ``delta`` (the paper's README; the public code steps against it). After the round
    SCAFFOLD's option II: ``c_k+ = c_k - c + (x_r - x_k)/(K eta)``. Server, after aggregating: ``c += (1/N) sum_S
    (c_k+ - c_k)``; ``alpha <- 0.99 alpha + 0.01 clip(mean_S[cos(Delta_k, m) + 1], 0.1, 0.9)`` with the momentum
    the clients used; then ``m = -sum_S p_k Delta_k / (K eta)`` (``K`` the weighted mean of the local steps). In the
    first round ``m = c = 0``.

    ``b`` counts the client's micro-batches (its optimizer steps without gradient accumulation, the paper's set-up;
    a step the fp16 loss scaler skips counts too), kept in the workspace and replaced after each. The momentum term, not a gradient, is scaled
    like the corrections' terms (``grad_at.bias_scale()``). Clipping is the step's (``max_grad_norm``, 10), on ``v``.
    Client state ``{"c_i"}``; server state ``{"m", "c", "alpha"}``, all broadcast; no message (the server computes
    ``c_k+ - c_k`` and the cosines from the deltas).
    """

    name = "wmsam"
    client_state_keys = ("c_i",)  # its per-client state (see ClientPiece)
    server_reads_updates = True  # c and the momentum's weight from each client's delta
    passes_per_step = 1
    #: hf_fedflat.algorithms.optimizers: refused ("error") or warned ("warn") with another local optimizer
    assumes_plain_sgd = True
    plain_sgd_policy = "error"
    plain_sgd_reason = (
        "c_k+ = c_k - c + (x_r - x_k)/(K*eta) and m = -mean(Delta_k)/(K*eta) are mean local gradients only when "
        "every step is x -= eta*v; with momentum or Adam they are mis-scaled")
    config_class = WMSAMConfig

    def begin(self, ctx: ClientContext) -> dict[str, object]:
        server = ctx.broadcast[self.name]
        alpha = float(server["alpha"])
        c_i = ctx.state.get(self.name, {}).get("c_i")
        c_i_minus_c = torch.neg(server["c"]) if c_i is None else torch.sub(c_i, server["c"])
        m_k = torch.sub(server["m"], c_i_minus_c, alpha=alpha / (1.0 - alpha))
        return {"alpha": alpha, "m_k": m_k, "x_r": ctx.global_params, "b": 0, "c_i": c_i, "c_i_minus_c": c_i_minus_c}

    def direction(self, grad_at: GradientOracle, workspace) -> tuple[Tensor, Tensor]:
        alpha, m_k, b = workspace["alpha"], workspace["m_k"], workspace["b"]
        delta = torch.add(workspace["x_r"], m_k, alpha=b).sub_(grad_at.weights())  # (x_r + b m_k) - x_b
        loss, g = grad_at(delta.mul_(self.config.rho / (global_norm(delta) + EPS)))
        workspace["b"] = b + 1
        return loss, torch.add(g * alpha, m_k, alpha=(1.0 - alpha) * grad_at.bias_scale())

    def end(self, ctx: ClientContext, workspace, result: LocalResult) -> tuple[StateDict, StateDict]:
        c_i_minus_c = workspace["c_i_minus_c"]
        if result.num_steps == 0:
            c_i = workspace["c_i"]
            return {"c_i": torch.zeros_like(c_i_minus_c) if c_i is None else c_i}, {}
        return {"c_i": torch.sub(c_i_minus_c, result.delta, alpha=1.0 / (result.num_steps * ctx.learning_rate))}, {}

    # server half -------------------------------------------------------------------------------------------
    def init_server_state(self, params: Tensor) -> StateDict:
        return {"m": torch.zeros_like(params), "c": torch.zeros_like(params),
                "alpha": torch.tensor([self.config.wmsam_alpha], dtype=params.dtype)}  # the run's precision

    def update_server_state(self, server_state: StateDict, summary: RoundSummary) -> StateDict:
        updates = summary.updates
        stepped = [u for u in updates if u.num_steps > 0]
        if not stepped:
            return server_state
        if summary.learning_rate <= 0:
            raise ValueError(f"FedWMSAM's server update needs the round's learning rate, got {summary.learning_rate}")
        eta, m = summary.learning_rate, server_state["m"]
        # c + (1/N) sum_k (c_k+ - c_k), with c_k+ - c_k = -c - Delta_k/(K_k eta) for the clients that stepped
        c = torch.mul(server_state["c"], 1.0 - len(stepped) / summary.num_clients)
        for update in stepped:
            c.add_(update.client_delta, alpha=-1.0 / (summary.num_clients * update.num_steps * eta))
        agreement = sum(shifted_cosine(u.client_delta, m) for u in updates) / len(updates)
        low, high = ALPHA_RANGE
        alpha = server_state["alpha"] * ALPHA_KEEP + (1.0 - ALPHA_KEEP) * min(max(agreement, low), high)
        steps = sum(w * u.num_steps for w, u in zip(summary.weights.tolist(), updates))
        new_m = weighted_delta(updates, summary.weights).div_(-steps * eta)
        return {"m": new_m, "c": c, "alpha": alpha}
