"""An algorithm as a value: one perturbation, a chain of corrections, one aggregator."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .base import (
    Aggregator,
    ClientContext,
    ClientPiece,
    ClientUpdate,
    Correction,
    GradFn,
    LocalResult,
    Perturbation,
    RoundSummary,
    StateDict,
    Tensor,
)
from .registry import AGGREGATOR_PLUGINS, AGGREGATORS, CORRECTIONS, PERTURBATIONS, get_preset, split_plugins

AGGREGATOR_KEY = "aggregator"


@dataclass
class FederatedAlgorithm:
    """The composition the training step and the server loop talk to.

    Server state is a ``dict[piece name, StateDict]`` with the aggregator's under ``"aggregator"``;
    client state is a ``dict[piece name, StateDict]``. Nothing here branches on the algorithm's name.
    """

    name: str
    perturbation: Perturbation
    corrections: tuple[Correction, ...]
    aggregator: Aggregator

    def __post_init__(self):
        names = [piece.name for piece in self.client_pieces]
        if len(set(names)) != len(names) or AGGREGATOR_KEY in names:
            raise ValueError(f"Client pieces must have distinct names (not {AGGREGATOR_KEY!r}); got {names}.")

    @property
    def client_pieces(self) -> tuple[ClientPiece, ...]:
        return (self.perturbation, *self.corrections)

    @property
    def is_plain_gradient(self) -> bool:
        """True when the step direction is the minibatch gradient itself (the Trainer's own step)."""
        return self.perturbation.is_identity and not self.corrections

    @property
    def corrects_grads_in_place(self) -> bool:
        """True when a step is one gradient at a fixed offset followed by corrections that all have an
        in-place form: the trainer then corrects ``p.grad`` directly (:meth:`correct_grads_`)."""
        return self.perturbation.single_fixed_pass and all(c.applies_in_place for c in self.corrections)

    def correct_grads_(self, grads: list[Tensor], params: list[Tensor], workspaces: dict[str, Any],
                       split: Callable[[Tensor], list[Tensor]], bias_scale: float = 1.0) -> None:
        """Every correction in order on the per-parameter gradients (see ``Correction.apply_to_grads_``)."""
        for correction in self.corrections:
            correction.apply_to_grads_(grads, params if correction.uses_params else None,
                                       workspaces[correction.name], split, bias_scale)

    @property
    def passes_per_step(self) -> int:
        return self.perturbation.passes_per_step

    # client side -----------------------------------------------------------------------------
    def begin_client(self, ctx: ClientContext) -> dict[str, Any]:
        return {piece.name: piece.begin(ctx) for piece in self.client_pieces}

    def direction(
        self,
        grad_at: GradFn,
        current_params: Callable[[], Tensor],
        workspaces: dict[str, Any],
        bias_scale: float = 1.0,
    ) -> tuple[Tensor, Tensor]:
        """``(loss, d)``: the perturbation's direction, then every correction in order.

        ``current_params()`` returns ``w`` as a flat vector; it is called only if a correction reads ``w``
        (a full copy per step that SCAFFOLD, say, does not need).
        """
        loss, direction = self.perturbation.direction(grad_at, workspaces[self.perturbation.name])
        params = current_params() if any(c.uses_params for c in self.corrections) else None
        for correction in self.corrections:
            direction = correction.apply(direction, params, workspaces[correction.name], bias_scale)
        return loss, direction

    def end_client(
        self, ctx: ClientContext, workspaces: dict[str, Any], result: LocalResult
    ) -> tuple[dict[str, StateDict], dict[str, StateDict]]:
        """``(new client state, messages to the server)``, keyed by piece name."""
        state, messages = {}, {}
        for piece in self.client_pieces:
            new_state, message = piece.end(ctx, workspaces[piece.name], result)
            if new_state:
                state[piece.name] = new_state
            if message:
                messages[piece.name] = message
        return state, messages

    # server side -----------------------------------------------------------------------------
    def init_server_state(self, params: Tensor) -> dict[str, StateDict]:
        state = {piece.name: piece.init_server_state(params) for piece in self.client_pieces}
        state[AGGREGATOR_KEY] = self.aggregator.init_state(params)
        return {key: value for key, value in state.items() if value}

    def broadcast(self, server_state: dict[str, StateDict]) -> dict[str, StateDict]:
        """What every client receives with the global weights (the aggregator's state stays on the server)."""
        out = {}
        for piece in self.client_pieces:
            if piece.name in server_state:
                part = piece.broadcast(server_state[piece.name])
                if part:
                    out[piece.name] = part
        return out

    def server_step(
        self,
        round_index: int,
        params: Tensor,
        updates: list[ClientUpdate],
        weights: Tensor,
        server_state: dict[str, StateDict],
        num_clients: int,
        learning_rate: float = 0.0,
    ) -> tuple[Tensor, dict[str, StateDict]]:
        """Aggregate, then let every piece's server half see the round."""
        new_state = dict(server_state)
        new_params, aggregator_state = self.aggregator.aggregate(
            params, updates, weights, server_state.get(AGGREGATOR_KEY, {})
        )
        if aggregator_state:
            new_state[AGGREGATOR_KEY] = aggregator_state
        summary = RoundSummary(round_index, params, new_params, updates, weights, num_clients, learning_rate)
        for piece in self.client_pieces:
            if piece.name in new_state:
                new_state[piece.name] = piece.update_server_state(new_state[piece.name], summary)
        return new_params, new_state

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "perturbation": self.perturbation.name,
            "corrections": [c.name for c in self.corrections],
            "aggregator": self.aggregator.name,
            "passes_per_step": self.passes_per_step,
        }


def resolve_parts(fed_algorithm: str, perturbation: str | None, corrections: str | None, aggregator: str | None):
    """The three part names: the preset's, each overridable by naming the part directly."""
    spec = get_preset(fed_algorithm)
    parts = (
        perturbation if perturbation is not None else spec.perturbation,
        tuple(c for c in corrections.split(",") if c) if corrections is not None else spec.corrections,
        aggregator if aggregator is not None else spec.aggregator,
    )
    aggregator_base, plugins = split_plugins(parts[2])
    for kind, names, table in (
        ("perturbation", (parts[0],), PERTURBATIONS),
        ("corrections", parts[1], CORRECTIONS),
        ("aggregator", (aggregator_base,), AGGREGATORS),
        ("aggregator", plugins, AGGREGATOR_PLUGINS),
    ):
        for name in names:
            if name not in table:
                raise ValueError(f"{kind}={name!r} is not a known {kind}. Available: {', '.join(sorted(table))}.")
    return parts


def build_algorithm(args) -> FederatedAlgorithm:
    """Build the composition named by ``args`` (a :class:`~hf_fedflat.FedTrainingArguments`).

    Each piece reads its own hyperparameters from ``args`` in its ``from_args``.
    """
    perturbation, corrections, aggregator = resolve_parts(
        args.fed_algorithm, args.perturbation, args.corrections, args.aggregator
    )
    aggregator_base, plugins = split_plugins(aggregator)
    server_rule = AGGREGATORS[aggregator_base].from_args(args)
    for plugin in plugins:  # "mean+fedgh": FedGH wraps the mean
        server_rule = AGGREGATOR_PLUGINS[plugin](server_rule)
    return FederatedAlgorithm(
        name=args.fed_algorithm,
        perturbation=PERTURBATIONS[perturbation].from_args(args),
        corrections=tuple(CORRECTIONS[name].from_args(args) for name in corrections),
        aggregator=server_rule,
    )
