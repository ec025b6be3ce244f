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
        difference = torch.sub(params, workspace, out=vectors.empty_like(params))
        return torch.add(direction, difference, alpha=self.mu * bias_scale, out=vectors.empty_like(direction))

    def apply_to_grads_(self, grads, params, workspace, split, bias_scale: float = 1.0) -> None:
        torch._foreach_add_(grads, torch._foreach_sub(params, split(workspace)), alpha=self.mu * bias_scale)
