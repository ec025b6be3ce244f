"""FedDecorr: decorrelation of the representation's dimensions against dimensional collapse.

Reference: Shi et al., "Towards Understanding and Mitigating Dimensional Collapse in Heterogeneous Federated
Learning", ICLR 2023.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..algorithms.base import (
    LossContext, LossTerm, PieceConfig, Tensor, check_choice, check_number, hyperparameter, register_correction,
)

#: added to the variance before the square root (a constant feature of the batch stays finite)
VARIANCE_EPS = 1e-8

PAPER, CODE = "paper", "code"
NORMALIZATIONS = (PAPER, CODE)


@dataclass
class FedDecorrConfig(PieceConfig):
    feddecorr_beta: float = hyperparameter(0.1, "FedDecorr: weight beta of the decorrelation loss ||K||_F^2 / d^2.")
    feddecorr_normalization: str = hyperparameter(
        PAPER,
        "FedDecorr's loss: 'paper' (||K||_F^2 / d^2, K the d x d correlation matrix of the batch) or 'code' (the "
        "authors' FedDecorrLoss: mean of the squared off-diagonal entries of Z^T Z / N, Z standardized with the "
        "unbiased variance; about N times the paper's gradient for the same beta, N the batch size).")

    def validate(self) -> None:
        check_number("feddecorr_beta", self.feddecorr_beta, low=0.0)
        check_choice("feddecorr_normalization", self.feddecorr_normalization, NORMALIZATIONS)


def decorrelation_loss(z: Tensor, normalization: str = PAPER) -> Tensor:
    """``||K||_F^2 / d^2`` with ``K = Z^T Z / N`` the correlation matrix of the batch's representations ``z``
    (``N x d``) standardized per dimension over the batch (population variance + 1e-8). 0 for a batch of one.

    ``normalization="code"``: the authors' code instead, ``mean_{j != k} ((Z^T Z)_{jk})^2 / N`` with ``Z``
    standardized by the unbiased variance + 1e-8, i.e. ``(N-1)^2 / (N d (d-1)) * sum_{j != k} K_jk^2``."""
    n, d = z.shape
    if n < 2:
        return z.sum() * 0.0
    centred = z - z.mean(dim=0, keepdim=True)
    if normalization == CODE:
        standardized = centred / torch.sqrt(centred.pow(2).sum(dim=0, keepdim=True) / (n - 1) + VARIANCE_EPS)
        gram = standardized.T @ standardized
        off_diagonal = gram.pow(2).sum() - torch.diagonal(gram).pow(2).sum()
        return off_diagonal / max(d * (d - 1), 1) / n
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
        return self.config.feddecorr_beta * decorrelation_loss(representation, self.config.feddecorr_normalization)
