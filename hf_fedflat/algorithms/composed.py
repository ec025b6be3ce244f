"""An algorithm as a value: one perturbation, a chain of corrections, one aggregator."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .base import (
    Aggregator,
    ClientContext,
    ClientPiece,
    ClientUpdate,
    Correction,
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
    def passes_per_step(self) -> int:
        return self.perturbation.passes_per_step

    # client side -----------------------------------------------------------------------------
    def begin_client(self, ctx: ClientContext) -> dict[str, Any]:
        return {piece.name: piece.begin(ctx) for piece in self.client_pieces}

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

    def release_update(self, ctx: ClientContext, delta: Tensor) -> Tensor:
        """What leaves the client of its update, after every piece's ``end`` read the update itself: the
        aggregator's ``release_update`` (``+dp``'s client mode clips and noises it here, on the client)."""
        return self.aggregator.release_update(ctx.round, ctx.client_id, delta)

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
        """Aggregate (then the aggregator's end of round), then let every piece's server half see the round.
        ``params`` is the server's ``w^t``, the updates' deltas are measured from what the clients received
        (``aggregator.broadcast_weights``)."""
        new_state = dict(server_state)
        aggregator_state = self.aggregator.begin_round(round_index, server_state.get(AGGREGATOR_KEY, {}))
        new_params, aggregator_state = self.aggregator.aggregate(params, updates, weights, aggregator_state)
        summary = RoundSummary(round_index, params, new_params, updates, weights, num_clients, learning_rate)
        aggregator_state = self.aggregator.end_round(aggregator_state, summary)
        if aggregator_state:
            new_state[AGGREGATOR_KEY] = aggregator_state
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
    for field, value in (("perturbation", perturbation), ("corrections", corrections), ("aggregator", aggregator)):
        if value is not None and not isinstance(value, str):
            raise ValueError(f"{field}: must be a name (text), got {value!r}.")
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


def algorithm_label(fed_algorithm: str, perturbation: str | None = None, corrections: str | None = None,
                    aggregator: str | None = None) -> str:
    """The preset's name, followed by every part that differs from the preset's: ``"dfedgam (aggregator=fedadam)"``,
    ``"scaffold (corrections=none)"``; just ``fed_algorithm`` when the parts are the preset's."""
    spec = get_preset(fed_algorithm)
    parts = resolve_parts(fed_algorithm, perturbation, corrections, aggregator)
    changed = []
    if parts[0] != spec.perturbation:
        changed.append(f"perturbation={parts[0]}")
    if tuple(parts[1]) != tuple(spec.corrections):
        changed.append(f"corrections={','.join(parts[1]) or 'none'}")
    if parts[2] != spec.aggregator:
        changed.append(f"aggregator={parts[2]}")
    return f"{fed_algorithm} ({', '.join(changed)})" if changed else fed_algorithm


def build_piece(cls: type, args) -> Any:
    """``cls(config, **run settings)`` with the config's fields read from ``args`` (None: the piece's default); a run
    setting ``args`` lacks (a test's namespace) takes the constructor's default."""
    settings = {name: getattr(args, name) for name in cls.run_settings if hasattr(args, name)}
    return cls(cls.config_class.from_args(args), **settings)


def build_algorithm(args) -> FederatedAlgorithm:
    """Build the composition named by ``args`` (a :class:`~hf_fedflat.FedTrainingArguments`, or any object with
    its fields as attributes).

    Each piece's config is read from the attributes named as its fields; a missing or ``None`` one takes the
    piece's default. Settings that contradict the composition are refused first, and hyperparameters given that no
    piece reads are warned about (``FedTrainingArguments.check_algorithm_settings``, see
    :mod:`hf_fedflat.algorithms.conflicts`). The algorithm's ``name`` is what runs: the preset's name, with the parts
    given in place of the preset's (:func:`algorithm_label`).
    """
    check = getattr(args, "check_algorithm_settings", None)  # FedTrainingArguments' (a test's namespace has none)
    if callable(check):
        check()
    perturbation, corrections, aggregator = resolve_parts(
        args.fed_algorithm, getattr(args, "perturbation", None), getattr(args, "corrections", None),
        getattr(args, "aggregator", None),
    )
    return FederatedAlgorithm(
        name=algorithm_label(args.fed_algorithm, *(getattr(args, part, None)
                                                   for part in ("perturbation", "corrections", "aggregator"))),
        perturbation=build_piece(PERTURBATIONS[perturbation], args),
        corrections=tuple(build_piece(CORRECTIONS[name], args) for name in corrections),
        aggregator=build_server_rule(aggregator, args),
    )


def build_server_rule(aggregator: str, args) -> Aggregator:
    """The server rule named ``aggregator`` with its plug-ins in order (``"mean+fedgh"``: FedGH wraps the mean),
    each configured from ``args``."""
    aggregator_base, plugins = split_plugins(aggregator)
    server_rule = build_piece(AGGREGATORS[aggregator_base], args)
    for plugin in plugins:
        plugin_class = AGGREGATOR_PLUGINS[plugin]
        settings = {name: getattr(args, name) for name in plugin_class.run_settings if hasattr(args, name)}
        server_rule = plugin_class(server_rule, plugin_class.config_class.from_args(args), **settings)
    return server_rule
