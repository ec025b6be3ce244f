"""FedDecorr: decorrelation of the representation's dimensions against dimensional collapse.

Reference: Shi et al., "Towards Understanding and Mitigating Dimensional Collapse in Heterogeneous Federated
Learning", ICLR 2023.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..algorithms.base import LossContext, LossTerm, Tensor
from ..algorithms.hyperparameters import PieceConfig, check_number, hyperparameter
from ..algorithms.registry import register_correction

#: added to the variance before the square root (a constant feature of the batch stays finite)
VARIANCE_EPS = 1e-8


@dataclass
class FedDecorrConfig(PieceConfig):
    feddecorr_beta: float = hyperparameter(0.1, "FedDecorr: weight beta of the decorrelation loss ||K||_F^2 / d^2.")

    def validate(self) -> None:
        check_number("feddecorr_beta", self.feddecorr_beta, low=0.0)


def decorrelation_loss(z: Tensor) -> Tensor:
    """``||K||_F^2 / d^2`` with ``K = Z^T Z / N`` the correlation matrix of the batch's representations ``z``
    (``N x d``) standardized per dimension over the batch (population variance + 1e-8). 0 for a batch of one."""
    n, d = z.shape
    if n < 2:
        return z.sum() * 0.0
    centred = z - z.mean(dim=0, keepdim=True)
    standardized = centred / torch.sqrt(centred.pow(2).mean(dim=0, keepdim=True) + VARIANCE_EPS)
    correlation = standardized.T @ standardized / n
    return correlation.pow(2).sum() / (d * d)


@register_correction
class FedDecorrLoss(LossTerm):
    """``loss += beta * ||K||_F^2 / d^2`` of the micro-batch's representation (the classification head's input,
    :mod:`hf_fedflat.models.representation`). No state, no server half, no extra forward."""

    name = "feddecorr"
    config_class = FedDecorrConfig

    def extra_loss(self, outputs, representation: Tensor, ctx: LossContext) -> Tensor:
        return self.config.feddecorr_beta * decorrelation_loss(representation)
