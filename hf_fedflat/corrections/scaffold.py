"""SCAFFOLD control variates (client term and server update).

Reference: Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated Learning",
ICML 2020 (option II for ``c_i``).
"""

from __future__ import annotations

import torch

from ..algorithms.base import ClientContext, Correction, LocalResult, RoundSummary, StateDict, Tensor
from ..algorithms.registry import register_correction
from .. import vectors


@register_correction
class ScaffoldCorrection(Correction):
    """Client: ``d += lambda_c * (c - c_i)``. After the round (K steps, lr eta):
    ``c_i+ = c_i - c + (w^t - w_i) / (K * eta)``; the message is ``dc_i = c_i+ - c_i``.
    Server: ``c += (1/N) * sum_{S_t} dc_i`` with N all clients.

    Client state: ``{"c_i"}`` (zeros before the first participation). Server state: ``{"c"}``.
    """

    name = "scaffold"
    uses_params = False

    def __init__(self, scale: float = 1.0):
        self.scale = scale

    @classmethod
    def from_args(cls, args) -> "ScaffoldCorrection":
        return cls(scale=args.scaffold_lambda)

    def begin(self, ctx: ClientContext) -> dict[str, Tensor]:
        c = ctx.broadcast[self.name]["c"]
        c_i = ctx.state.get(self.name, {}).get("c_i")  # None: zeros (first participation)
        shift = c if c_i is None else torch.sub(c, c_i, out=vectors.empty_like(c))
        return {"c": c, "c_i": c_i, "shift": shift}

    def apply(self, direction: Tensor, params: Tensor | None, workspace, bias_scale: float = 1.0) -> Tensor:
        return torch.add(direction, workspace["shift"], alpha=self.scale * bias_scale, out=vectors.empty_like(direction))

    def apply_to_grads_(self, grads, params, workspace, split, bias_scale: float = 1.0) -> None:
        torch._foreach_add_(grads, split(workspace["shift"]), alpha=self.scale * bias_scale)

    def end(self, ctx: ClientContext, workspace, result: LocalResult) -> tuple[StateDict, StateDict]:
        c, c_i = workspace["c"], workspace["c_i"]
        if result.num_steps == 0:
            return {"c_i": torch.zeros_like(c) if c_i is None else c_i}, {"dc": vectors.zeros_like(c)}
        # dc_i = c_i+ - c_i = (w^t - w_i) / (K * eta) - c. Dividing the shared w_i - w^t by -K*eta gives the
        # same bits as (w^t - w_i) / (K * eta) (IEEE subtraction and division are sign-symmetric).
        dc = torch.div(result.delta, -(result.num_steps * ctx.learning_rate), out=vectors.empty_like(c)).sub_(c)
        # First participation: c_i+ = 0 + dc is dc itself; state and message may share it (both are only read).
        c_i_new = dc if c_i is None else torch.add(c_i, dc, out=vectors.empty_like(dc))
        return {"c_i": c_i_new}, {"dc": dc}

    def init_server_state(self, params: Tensor) -> StateDict:
        return {"c": torch.zeros_like(params)}

    def update_server_state(self, server_state: StateDict, summary: RoundSummary) -> StateDict:
        dcs = [update.messages[self.name]["dc"] for update in summary.updates]
        if not dcs:
            return server_state
        # The first add writes the new c (no separate copy of the old one), the rest accumulate in place.
        c = torch.add(server_state["c"], dcs[0], alpha=1.0 / summary.num_clients, out=vectors.empty_like(dcs[0]))
        for dc in dcs[1:]:
            c.add_(dc, alpha=1.0 / summary.num_clients)
        return {"c": c}
