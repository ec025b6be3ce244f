"""FedProx's proximal term.

Reference: Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020.
"""

from __future__ import annotations

import torch

from ..algorithms.base import ClientContext, Correction, Tensor
from ..algorithms.registry import register_correction
from .. import vectors


@register_correction
class ProxCorrection(Correction):
    """``d += mu * (w - w^t)``: the gradient of ``(mu/2) ||w - w^t||^2``. No state."""

    name = "prox"

    def __init__(self, mu: float = 0.01):
        self.mu = mu

    @classmethod
    def from_args(cls, args) -> "ProxCorrection":
        return cls(mu=args.prox_mu)

    def begin(self, ctx: ClientContext) -> Tensor:
        return ctx.global_params

    def apply(self, direction: Tensor, params: Tensor | None, workspace, bias_scale: float = 1.0) -> Tensor:
        scale = self.mu * bias_scale
        # mu*w - mu*w^t added in two passes rather than mu*(w - w^t): no temporary w - w^t per step
        # (measured 0.59 -> 0.38 ms a step on the 0.58M-parameter benchmark CNN); the same operations in
        # the same order as apply_to_grads_, so both paths stay bit-identical
        return torch.add(direction, params, alpha=scale, out=vectors.empty_like(direction)).add_(workspace, alpha=-scale)

    def apply_to_grads_(self, grads, params, workspace, split, bias_scale: float = 1.0) -> None:
        scale = self.mu * bias_scale
        torch._foreach_add_(grads, params, alpha=scale)
        torch._foreach_add_(grads, split(workspace), alpha=-scale)
