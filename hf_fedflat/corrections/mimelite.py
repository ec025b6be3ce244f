"""MimeLite: the server's momentum applied in every client step, updated with full-batch gradients.

Reference: Karimireddy et al., "Breaking the centralized barrier for cross-device federated learning" (Mime),
NeurIPS 2021; MimeLite with SGD + momentum as the base optimizer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..algorithms.base import (
    ClientContext, Correction, LocalResult, PieceConfig, RoundSummary, StateDict, Tensor, check_number, hyperparameter,
    register_correction, weighted_sum,
)


@dataclass
class MimeLiteConfig(PieceConfig):
    mime_beta: float = hyperparameter(0.9, "MimeLite: momentum beta in d = (1-beta) g + beta m and m <- (1-beta) "
                                            "mean_i grad f_i(x) + beta m.")

    def validate(self) -> None:
        check_number("mime_beta", self.mime_beta, low=0.0, high=1.0)


@register_correction
class MimeLiteCorrection(Correction):
    """Client step ``d = (1 - beta) g + beta m`` with the server momentum ``m`` fixed for the round (broadcast).
    At the start of its round (weights ``x = w^t``) the client computes its full-batch gradient ``grad f_i(x)``
    (``ClientContext.full_gradient``: one pass over its data) and sends it (message ``{"grad"}``). Server:
    ``m <- (1 - beta) * sum_i p_i grad f_i(x) + beta * m`` over the aggregated clients (the ``mimelite`` preset
    averages uniformly, the paper's ``1/|S|``). ``m`` starts at 0. No client state.
    """

    name = "mimelite"
    client_state_keys = ()  # keeps no per-client state (see ClientPiece)
    server_reads_updates = True  # m from each client's full-batch gradient
    assumes_plain_sgd = True
    plain_sgd_policy = "warn"
    plain_sgd_reason = "MimeLite's client step is SGD with the server's momentum; a local optimizer adds its own state"
    config_class = MimeLiteConfig

    def begin(self, ctx: ClientContext) -> dict[str, Tensor]:
        if ctx.full_gradient is None:
            raise ValueError("mimelite needs the client's full-batch gradient at the server model "
                             "(ClientContext.full_gradient); this context has none.")
        return {"m": ctx.broadcast[self.name]["m"], "grad": ctx.full_gradient()}

    def correct(self, D, W, ws):
        beta = self.config.mime_beta
        return (1 - beta) * D + beta * ws["m"]

    def end(self, ctx: ClientContext, workspace, result: LocalResult) -> tuple[None, StateDict]:
        return None, {"grad": workspace["grad"]}

    def init_server_state(self, params: Tensor) -> StateDict:
        return {"m": torch.zeros_like(params)}

    def update_server_state(self, server_state: StateDict, summary: RoundSummary) -> StateDict:
        grads = [u.messages[self.name]["grad"] for u in summary.updates if self.name in u.messages]
        if not grads:
            return server_state
        weights = torch.tensor([w for w, u in zip(summary.weights.tolist(), summary.updates) if self.name in u.messages])
        beta = self.config.mime_beta
        mean = weighted_sum([g.to(server_state["m"].device) for g in grads], weights / weights.sum())
        return {"m": mean.mul_(1 - beta).add_(server_state["m"], alpha=beta)}
