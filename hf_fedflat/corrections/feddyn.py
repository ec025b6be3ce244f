"""FedDyn's dynamic regulariser (client half; the server rule is the ``feddyn`` aggregator).

Reference: Acar et al., "Federated Learning Based on Dynamic Regularization", ICLR 2021.
"""

from __future__ import annotations

import torch

from ..algorithms.base import ClientContext, Correction, LocalResult, StateDict, Tensor
from ..algorithms.registry import register_correction
from .. import vectors


@register_correction
class FedDynCorrection(Correction):
    """``d += alpha * (w - w^t) + alpha * h_i``; after the round ``h_i += w_i - w^t``.

    ``-alpha * h_i`` is the client's linear term ``grad L_i`` of FedDyn's local objective
    ``L_i(w) - <grad L_i(w_i^{t-1}), w> + (alpha/2) ||w - w^t||^2``. Client state ``{"h"}`` (zeros at first).
    """

    name = "feddyn"

    def __init__(self, alpha: float = 0.1):
        self.alpha = alpha

    @classmethod
    def from_args(cls, args) -> "FedDynCorrection":
        return cls(alpha=args.feddyn_alpha)

    def begin(self, ctx: ClientContext) -> dict[str, Tensor]:
        h = ctx.state.get(self.name, {}).get("h")
        if h is None:
            h = torch.zeros_like(ctx.global_params)
        # alpha*(w - w^t) + alpha*h = alpha*w + alpha*(h - w^t): one constant vector per round
        return {"h": h, "shift": torch.sub(h, ctx.global_params, out=vectors.empty_like(h))}

    def apply(self, direction: Tensor, params: Tensor | None, workspace, bias_scale: float = 1.0) -> Tensor:
        scale = self.alpha * bias_scale
        return torch.add(direction, params, alpha=scale, out=vectors.empty_like(direction)).add_(workspace["shift"], alpha=scale)

    def apply_to_grads_(self, grads, params, workspace, split, bias_scale: float = 1.0) -> None:
        scale = self.alpha * bias_scale
        torch._foreach_add_(grads, params, alpha=scale)
        torch._foreach_add_(grads, split(workspace["shift"]), alpha=scale)

    def end(self, ctx: ClientContext, workspace, result: LocalResult) -> tuple[StateDict, StateDict]:
        h = workspace["h"]
        return {"h": torch.add(h, result.delta, out=vectors.empty_like(h))}, {}
