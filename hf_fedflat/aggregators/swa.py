"""FedSWA: stochastic weight averaging of the global models on the server, with a cyclic client learning rate; a
plug-in in front of any aggregator (``<aggregator>+swa``, ``--fed_algorithm fedsam+swa``).

Reference: Caldarola et al., "Improving Generalization in Federated Learning by Seeking Flat Minima", ECCV 2022
(FedSWA; not the 2025 method of the same name); SWA itself: Izmailov et al., "Averaging Weights Leads to Wider
Optima and Better Generalization", UAI 2018.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..algorithms.base import (
    Aggregator, AggregatorPlugin, ClientUpdate, PieceConfig, RoundSummary, StateDict, Tensor, check_integer,
    check_number, hyperparameter, register_aggregator_plugin,
)

#: the plug-in's own keys in the aggregator state, beside the rule's it is in front of
SWA_KEYS = ("swa_weights", "swa_models")


@dataclass
class SWAConfig(PieceConfig):
    swa_start_fraction: float = hyperparameter(
        0.75, "FedSWA: the round s0 = int(swa_start_fraction * num_rounds) from which the client learning rate "
        "cycles and the server averages the global models.")
    swa_cycle_rounds: int = hyperparameter(
        10, "FedSWA: rounds c per cycle: the client learning rate of round i >= s0 is (1 - t) lr_1 + t lr_2, "
        "t = ((i mod c) + 1)/c, and the global model is averaged in after each round with t = 1.")
    swa_learning_rate: float = hyperparameter(
        1e-4, "FedSWA: lr_2, the client learning rate of the last round of each cycle (lr_1 is the run's).")

    def validate(self) -> None:
        check_number("swa_start_fraction", self.swa_start_fraction, low=0.0, high=1.0)
        check_integer("swa_cycle_rounds", self.swa_cycle_rounds, low=1)
        check_number("swa_learning_rate", self.swa_learning_rate, low=0.0, low_open=True)


@register_aggregator_plugin
class SWAAggregator(AggregatorPlugin):
    """From round ``s0`` the clients' learning rate cycles from near ``lr_1`` (the run's) down to ``lr_2`` over ``c``
    rounds; after each round that ran at ``lr_2`` (the end of a cycle) the server folds the new global model into
    ``w_swa <- (n w_swa + w)/(n + 1)``, ``n`` the models folded so far. Training goes on from ``w``; the model
    evaluated and saved is ``w_swa`` (``w`` until the first fold). The rule in front of which it sits aggregates as
    it would alone.

    State: the base rule's and ``{"swa_weights": w_swa, "swa_models": n}``. The round's cycle position is a
    function of the round index alone, so a resumed run or another process computes the same learning rate.
    """

    plugin = "swa"
    config_class = SWAConfig
    run_settings = ("num_rounds",)

    def __init__(self, base: Aggregator, config: SWAConfig | None = None, num_rounds: int = 1):
        super().__init__(base, config)
        self.capabilities = base.capabilities  # it aggregates exactly as the base rule does
        self.start_round = int(self.config.swa_start_fraction * num_rounds)

    def _cycle_position(self, round_index: int) -> float | None:
        """``t = ((i mod c) + 1)/c`` from round ``s0`` on; None before."""
        if round_index < self.start_round:
            return None
        cycle = self.config.swa_cycle_rounds
        return ((round_index % cycle) + 1) / cycle

    def client_learning_rate(self, round_index: int, learning_rate: float) -> float:
        learning_rate = self.base.client_learning_rate(round_index, learning_rate)
        t = self._cycle_position(round_index)
        return learning_rate if t is None else (1 - t) * learning_rate + t * self.config.swa_learning_rate

    def init_state(self, params: Tensor) -> StateDict:
        return {**self.base.init_state(params), "swa_weights": torch.zeros_like(params),
                "swa_models": torch.zeros((), dtype=torch.int64)}

    @staticmethod
    def _split(state: StateDict) -> tuple[StateDict, StateDict]:
        """``(the base rule's state, this plug-in's)``."""
        return ({k: v for k, v in state.items() if k not in SWA_KEYS}, {k: state[k] for k in SWA_KEYS})

    def aggregate(
        self, params: Tensor, updates: list[ClientUpdate], weights: Tensor, state: StateDict
    ) -> tuple[Tensor, StateDict]:
        base_state, own = self._split(state)
        new_params, base_state = self.base.aggregate(params, updates, weights, base_state)
        return new_params, {**base_state, **own}

    def broadcast_weights(self, round_index: int, params: Tensor, state: StateDict) -> Tensor:
        return self.base.broadcast_weights(round_index, params, self._split(state)[0])

    def end_round(self, state: StateDict, summary: RoundSummary) -> StateDict:
        base_state, own = self._split(state)
        base_state = self.base.end_round(base_state, summary)
        cycle = self.config.swa_cycle_rounds
        if summary.round >= self.start_round and summary.round % cycle == cycle - 1:  # it ran at lr_2 (t = 1)
            n = int(own["swa_models"])
            folded = own["swa_weights"].mul(n).add_(summary.new_params).div_(n + 1)
            own = {"swa_weights": folded, "swa_models": torch.tensor(n + 1, dtype=torch.int64)}
        return {**base_state, **own}

    def evaluation_weights(self, params: Tensor, state: StateDict) -> Tensor:
        base_state, own = self._split(state)
        if int(own["swa_models"]) == 0:
            return self.base.evaluation_weights(params, base_state)
        return own["swa_weights"]
