"""MOON: model-contrastive federated learning (a loss term on the model's representation).

Reference: Li, He and Song, "Model-Contrastive Federated Learning", CVPR 2021, eq. (1)-(3).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..algorithms.base import (
    ClientContext, LocalResult, LossContext, LossTerm, PieceConfig, StateDict, Tensor, check_number, hyperparameter,
    register_correction,
)


@dataclass
class MoonConfig(PieceConfig):
    moon_mu: float = hyperparameter(1.0, "MOON: weight mu of the model-contrastive loss (paper: 5 CIFAR-10, 1 CIFAR-100).")
    moon_temperature: float = hyperparameter(0.5, "MOON: temperature tau of the contrastive loss (paper: 0.5).")

    def validate(self) -> None:
        check_number("moon_mu", self.moon_mu, low=0.0)
        check_number("moon_temperature", self.moon_temperature, low=0.0, low_open=True)


def contrastive_loss(z: Tensor, z_global: Tensor, z_previous: Tensor, temperature: float) -> Tensor:
    """MOON eq. (2), mean over the batch: ``-log( e^{sim(z, z_glob)/tau} / (e^{sim(z, z_glob)/tau} +
    e^{sim(z, z_prev)/tau}) )`` with ``sim`` the cosine similarity."""
    positive = torch.nn.functional.cosine_similarity(z, z_global, dim=-1) / temperature
    negative = torch.nn.functional.cosine_similarity(z, z_previous, dim=-1) / temperature
    return (torch.logsumexp(torch.stack([positive, negative], dim=-1), dim=-1) - positive).mean()


@register_correction
class MoonLoss(LossTerm):
    """``loss += mu * l_con(z, z_glob, z_prev)`` (eq. 3), ``z`` the representation of the micro-batch at the local
    weights, ``z_glob`` at the round's global model ``w^t``, ``z_prev`` at the client's previous local model
    ``w_i^{t-1}`` (client state ``{"w_prev"}``, the client's weights at the end of its last round).

    Before a client's first round there is no previous local model: ``z_prev = z_glob`` (the MOON code's pool
    starts with the global model), which makes ``l_con = log 2``, a constant with zero gradient, so the step is
    plain ERM and the extra forward is skipped. The representation is the input of the classification head
    (:mod:`hf_fedflat.models.representation`); the paper's models add a projection head, which this piece does not
    add to the model (set ``model.representation_module`` to read a projection of your own).
    """

    name = "moon"
    client_state_keys = ("w_prev",)  # its per-client state (see ClientPiece)
    config_class = MoonConfig

    def begin(self, ctx: ClientContext) -> dict[str, Tensor | None]:
        return {"global": ctx.global_params, "previous": ctx.state.get(self.name, {}).get("w_prev")}

    def extra_loss(self, outputs, representation: Tensor, ctx: LossContext) -> Tensor:
        z_global = ctx.represent_at(ctx.workspace["global"])
        previous = ctx.workspace["previous"]
        z_previous = z_global if previous is None else ctx.represent_at(previous)
        return self.config.moon_mu * contrastive_loss(representation, z_global, z_previous,
                                                      self.config.moon_temperature)

    def end(self, ctx: ClientContext, workspace, result: LocalResult) -> tuple[StateDict, StateDict]:
        return {"w_prev": torch.add(ctx.global_params, result.delta)}, {}
