"""FedGMT's client objective: distillation towards a moving average of the global models, plus a linear dual term
(the client half; the server rule is the ``fedgmt`` aggregator).

Reference: Li et al., "One Arrow, Two Hawks: Sharpness-aware Minimization for Federated Learning via Global Model
Trajectory" (FedGMT), ICML 2025.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from ..algorithms.base import (
    ClientContext, LocalResult, LossContext, LossTerm, PieceConfig, RoundSummary, StateDict, Tensor, check_choice,
    check_number, hyperparameter, register_correction,
)

ALL_CLIENTS, SAMPLED = "all_clients", "sampled"
DUAL_AVERAGES = (ALL_CLIENTS, SAMPLED)
DUAL_AVERAGE_HELP = (
    "FedGMT server: w^{t+1} = sum_S p_m w_m + (1/M) sum d_m over all M clients ('all_clients', the paper and its "
    "code) or the mean of the sampled clients' d_m ('sampled'; each sampled client then sends its d_m).")


@dataclass
class FedGMTConfig(PieceConfig):
    fedgmt_gamma: float = hyperparameter(1.0, "FedGMT: weight gamma of the distillation towards the moving average.")
    fedgmt_tau: float = hyperparameter(
        3.0, "FedGMT: temperature tau of the distillation (public code; the term is scaled by tau^2).")
    fedgmt_beta: float = hyperparameter(10.0, "FedGMT: the dual term is <w, d_m>/beta.")
    fedgmt_ema: float = hyperparameter(
        0.95, "FedGMT: the moving average of the global models, e <- a e + (1 - a) w^{t+1}; a.")
    fedgmt_dual_average: str = hyperparameter(ALL_CLIENTS, DUAL_AVERAGE_HELP)

    def validate(self) -> None:
        check_number("fedgmt_gamma", self.fedgmt_gamma, low=0.0)
        check_number("fedgmt_tau", self.fedgmt_tau, low=0.0, low_open=True)
        check_number("fedgmt_beta", self.fedgmt_beta, low=0.0, low_open=True)
        check_number("fedgmt_ema", self.fedgmt_ema, low=0.0, high=1.0)
        check_choice("fedgmt_dual_average", self.fedgmt_dual_average, DUAL_AVERAGES)


def logits_of(outputs) -> Tensor:
    """The logits of a model's outputs: its ``logits`` entry (``transformers`` models, ``{"logits": ...}``) or the
    outputs themselves when they are one tensor."""
    if isinstance(outputs, Mapping) and "logits" in outputs:
        return outputs["logits"]
    if isinstance(outputs, Tensor):
        return outputs
    raise TypeError("FedGMT needs the model's logits: its forward must return a tensor or a mapping with 'logits'.")


def distillation(logits: Tensor, teacher_logits: Tensor, tau: float) -> Tensor:
    """``KL(softmax(teacher/tau) || softmax(logits/tau))`` summed over the classes (the last dimension), mean over
    the rest (the rows; the positions of a sequence model)."""
    teacher = torch.softmax(teacher_logits.detach() / tau, dim=-1)
    log_student = torch.log_softmax(logits / tau, dim=-1)
    return torch.nn.functional.kl_div(log_student, teacher, reduction="none").sum(dim=-1).mean()


@register_correction
class FedGMTLoss(LossTerm):
    """``loss += gamma tau^2 KL(softmax(f_e(x)/tau) || softmax(f_w(x)/tau))`` on every micro-batch, ``e`` the
    moving average of the global models; and the dual term ``<w, d_m>/beta``, whose gradient ``d_m/beta`` is added
    to the direction (an affine term, scaled like the corrections'). After the round ``d_m += w_m - w^t``.

    Client state ``{"dual"}`` (``d_m``, zeros at first). Server half: the moving average, ``e_0 = w^0`` and
    ``e <- a e + (1 - a) w^{t+1}`` after each round, broadcast. The teacher's forward runs without gradient in eval
    mode (``ctx.outputs_at``): one extra forward per training pass.
    """

    name = "fedgmt"
    client_state_keys = ("dual",)  # its per-client state (see ClientPiece)
    config_class = FedGMTConfig

    def begin(self, ctx: ClientContext) -> dict[str, Tensor]:
        dual = ctx.state.get(self.name, {}).get("dual")
        return {"ema": ctx.broadcast[self.name]["ema"],
                "dual": torch.zeros_like(ctx.global_params) if dual is None else dual}

    def extra_loss(self, outputs, representation: Tensor, ctx: LossContext) -> Tensor:
        tau = self.config.fedgmt_tau
        teacher = logits_of(ctx.outputs_at(ctx.workspace["ema"]))
        return (self.config.fedgmt_gamma * tau * tau) * distillation(logits_of(outputs), teacher, tau)

    def correct(self, D, W, ws):
        return D + (1.0 / self.config.fedgmt_beta) * ws["dual"]

    def end(self, ctx: ClientContext, workspace, result: LocalResult) -> tuple[StateDict, StateDict]:
        dual = torch.add(workspace["dual"], result.delta)
        return {"dual": dual}, ({"dual": dual} if self.config.fedgmt_dual_average == SAMPLED else {})

    def init_server_state(self, params: Tensor) -> StateDict:
        return {"ema": params.clone()}

    def update_server_state(self, server_state: StateDict, summary: RoundSummary) -> StateDict:
        a = self.config.fedgmt_ema
        return {"ema": torch.mul(server_state["ema"], a).add_(summary.new_params, alpha=1.0 - a)}
