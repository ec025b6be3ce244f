"""What a round does with the clients' results: the one protocol the round loop talks to.

A :class:`Strategy` answers, for the loop in :mod:`hf_fedflat.federation.loop`:

- ``sample(round)``: which clients train (every process asks; the answer is seeded, the same everywhere; a
  strategy with ``sample_on_main`` draws secret randomness, and the main process's answer is every process's);
- ``round_limit(num_rounds)``: ``(rounds to run, why fewer)`` (a privacy budget may end the run early);
- ``learning_rate(round, learning_rate)``: the round's local learning rate, given the run's schedule (every
  process asks; a server rule may drive it: SWA's cycle);
- ``send(comm, shares, round)``: what the processes receive for the round (a collective: every process calls it);
- ``client_start(client_id, received)``: what one client starts from (:class:`~.client.ClientStart`);
- ``apply(round, learning_rate, updates, weights)`` (main process): how the gathered results become the
  next state; returns the round's record fields of the strategy (the loop adds round, clients, loss, eval).
  A new state with a NaN or Inf is refused before it replaces the old one (:func:`refuse_non_finite` raises
  :class:`NonFiniteServerStep`; the loop counts the round as failed);
- ``model()``: the run's current model ``{"params"[, "buffers"]}``, what training continues from and checkpoints
  hold; ``evaluation_model()``: the model evaluated and saved as the final one (SWA's average; else ``model()``);
- ``server_state()``: what a checkpoint holds besides the model and the client-state store;
- ``evaluate_more(evaluate)``: further eval metrics (decentralized: the clients' own models);
- ``start(initial, restored)`` (main process) and ``describe()`` (for ``federated_config.json``);
- ``fingerprint``: settings a checkpoint of this strategy must match;
- ``client_state_template(initial)``: what every client state holds (keys, shapes, dtypes), from the run's own
  pieces: a resume checks a checkpoint's client states against it, and every new state is checked as stored.

:class:`ServerStrategy` is server FL (a global model ``w^t``, aggregated by the algorithm's server step);
``hf_fedflat.decentralized.gossip_strategy.GossipStrategy`` keeps one model per client and gossips.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import torch

from ..algorithms import ClientUpdate
from ..algorithms.composed import AGGREGATOR_KEY
from ..algorithms.base import weighted_sum
from ..diagnostics.run import tensor_bytes
from .checkpoint import ClientStateTemplate, Restored
from .client import ClientStart
from ..privacy import accountant_for
from ..sampling import sample_clients
from ..training.parameters import all_finite
from .wire import client_states_payload, round_payload, split_payload

Weights = dict[str, torch.Tensor]  # {"params": flat trainable parameters[, "buffers": flat averaged buffers]}


class NonFiniteServerStep(ArithmeticError):
    """A round's new model or server state holds a NaN or Inf: the strategy refused it and kept its old state
    (the loop records the round as failed, with this message as the reason)."""


def refuse_non_finite(what: str, parts: dict) -> None:
    """Raise :class:`NonFiniteServerStep` naming the first non-finite tensor of ``parts`` (nested dicts of
    tensors); one pass over each tensor (a sum, see ``all_finite``). ``what``: "server step", "gossip", ..."""
    for name, tensor in _named_tensors(parts):
        if not all_finite(tensor):
            raise NonFiniteServerStep(
                f"non-finite {what}: {name} has NaN or Inf; refused, the model and state stay as they were"
            )


def _named_tensors(parts: dict, prefix: str = ""):
    for key, value in parts.items():
        if isinstance(value, torch.Tensor):
            yield prefix + str(key), value
        elif isinstance(value, dict):
            yield from _named_tensors(value, f"{prefix}{key}.")


class Strategy(Protocol):
    fingerprint: dict[str, Any]

    def start(self, initial: Weights, restored: Restored | None) -> None: ...

    def sample(self, round_index: int) -> list[int]: ...

    def round_limit(self, num_rounds: int) -> tuple[int, str | None]: ...

    def learning_rate(self, round_index: int, learning_rate: float) -> float: ...

    def send(self, comm, shares: list[list[int]], round_index: int) -> dict: ...

    def client_start(self, client_id: int, received: dict) -> ClientStart: ...

    def apply(self, round_index: int, learning_rate: float, updates: list[ClientUpdate],
              weights: torch.Tensor | None) -> dict[str, Any]: ...

    def model(self) -> Weights: ...

    def evaluation_model(self) -> Weights: ...

    def server_state(self) -> dict: ...

    def evaluate_more(self, evaluate: Callable[..., dict[str, float]]) -> dict[str, float]: ...

    def describe(self) -> dict[str, Any]: ...

    def client_state_template(self, initial: Weights) -> ClientStateTemplate: ...


class ServerStrategy:
    """Server FL: every round the sampled clients start from ``w^t`` (and what the pieces broadcast, and
    their own stored state); the algorithm's server step turns their updates into ``w^{t+1}``.

    The aggregator's hooks decide what differs from that: the weights sent (``broadcast_weights``: the clients
    start from them and their deltas are measured from them, the server keeps ``w^t``), the round's local
    learning rate (``client_learning_rate``) and the model evaluated and saved (``evaluation_weights``).

    Args:
        algorithm: the run's ``FederatedAlgorithm``.
        args: the run's arguments.
        store: the client-state store (main process; None elsewhere).
        diagnostics: the run's ``RunDiagnostics`` (bytes sent, gradient conflict, perturbation drift).
    """

    def __init__(self, algorithm, args, store, diagnostics):
        self.algorithm, self.args, self.store, self.diagnostics = algorithm, args, store, diagnostics
        self.fingerprint: dict[str, Any] = {}
        self.weights: Weights = {}
        self.state: dict = {}
        self.template = ClientStateTemplate()
        self.payload_bytes = 0  # what one client downloads per round
        #: whether the clients' states are kept in ``store`` (False where each node keeps its own: hf_fedflat.flower)
        self.client_states_here = True
        #: a noised release's privacy mechanism (+dp) and its accountant; None: no privacy claimed
        self.privacy = algorithm.aggregator.privacy_mechanism()
        self.accountant = accountant_for(self.privacy)
        #: the sampling draws from the OS's cryptographic source: the main process's list is every process's
        self.sample_on_main = bool(self.privacy and self.privacy.get("secure_rng"))

    def client_state_template(self, initial: Weights) -> ClientStateTemplate:
        """Every client with state holds each key the pieces declare: a flat vector like the parameters."""
        return ClientStateTemplate.from_pieces(self.algorithm.client_pieces, initial["params"])

    def start(self, initial: Weights, restored: Restored | None) -> None:
        self.template = self.client_state_template(initial)
        self.weights = dict(initial)
        self.state = self.algorithm.init_server_state(initial["params"])
        if restored is not None:
            self.weights, self.state = dict(restored.weights), restored.server_state

    def sample(self, round_index: int) -> list[int]:
        """The round's clients: the aggregator's own sampling if it has one (``+dp``: Poisson), else the run's
        seeded draw of ``clients_per_round`` clients."""
        args = self.args
        chosen = self.algorithm.aggregator.sample_clients(round_index, args.num_clients, args.num_clients_per_round,
                                                          args.seed)
        if chosen is not None:
            return chosen
        return sample_clients(args.num_clients, args.num_clients_per_round, args.seed, round_index)

    def round_limit(self, num_rounds: int) -> tuple[int, str | None]:
        """``(rounds to run, why fewer than num_rounds)``: with a privacy budget (``dp_target_epsilon``), the rounds
        whose composed epsilon stays within it."""
        target = (self.privacy or {}).get("target_epsilon")
        if self.accountant is None or target is None:
            return num_rounds, None
        rounds = self.accountant.rounds_within(target, num_rounds)
        if rounds == num_rounds:
            return num_rounds, None
        return rounds, (f"dp_target_epsilon={target:g}: round {rounds + 1} would spend epsilon "
                        f"{self.accountant.epsilon(rounds + 1):.4g} > {target:g} (delta {self.accountant.delta:g}); "
                        f"the run stopped after round {rounds} of {num_rounds} and saved its model")

    def learning_rate(self, round_index: int, learning_rate: float) -> float:
        return self.algorithm.aggregator.client_learning_rate(round_index, learning_rate)

    def send(self, comm, shares: list[list[int]], round_index: int) -> dict:
        """main -> all: the weights the aggregator sends (``w^t`` unless it says otherwise; and buffers) and what
        the pieces broadcast; main -> each process: the states of the clients it trains."""
        main = comm.is_main
        payload = comm.broadcast_tensors(self.round_inputs(round_index) if main else None)
        self.payload_bytes = tensor_bytes(payload)
        payload.update(comm.scatter_tensors(
            [client_states_payload({c: self.store.get(c) for c in share}) for share in shares] if main else None))
        params, buffers, broadcast, states = split_payload(payload)
        return {"params": params, "buffers": buffers, "broadcast": broadcast, "states": states}

    def round_inputs(self, round_index: int) -> dict[str, torch.Tensor]:
        """What every client of the round receives (main process): the weights the aggregator sends and what the
        pieces broadcast, as the wire's ``params`` / ``buffers`` / ``broadcast/<piece>/<key>`` tensors."""
        return round_payload(self._sent_weights(round_index), self.algorithm.broadcast(self.state))

    def _sent_weights(self, round_index: int) -> Weights:
        sent = self.algorithm.aggregator.broadcast_weights(
            round_index, self.weights["params"], self.state.get(AGGREGATOR_KEY, {}))
        return {**self.weights, "params": sent}

    def client_start(self, client_id: int, received: dict) -> ClientStart:
        return ClientStart(received["params"], received["broadcast"], received["states"].get(client_id, {}),
                           received["buffers"])

    def apply(self, round_index: int, learning_rate: float, updates: list[ClientUpdate],
              weights: torch.Tensor | None) -> dict[str, Any]:
        """Aggregate (unless every client failed), update the server halves and the client-state store."""
        privacy = {} if self.accountant is None else {"dp_epsilon": self.accountant.epsilon(round_index + 1)}
        if not updates and not self.algorithm.aggregator.capabilities.noised_release:
            return privacy  # the global model stays as it was (a noised release releases noise alone)
        params, state = self.algorithm.server_step(
            round_index, self.weights["params"], updates, weights, self.state, self.args.num_clients, learning_rate
        )
        new = {"params": params}
        if "buffers" in self.weights:  # running statistics: weighted mean, like FedAvg
            new["buffers"] = weighted_sum([u.buffers for u in updates], weights)
        # e.g. FedAdam with server_tau 0 (0/0): checked before it replaces the old model and state
        refuse_non_finite("server step", {**new, "server_state": state})
        self.weights, self.state = new, state
        if self.client_states_here:
            for update in updates:
                self.template.check_live(update.client_id, update.state)
                if update.state:
                    self.store.put(update.client_id, update.state)
        return {**privacy, **(self.diagnostics.round_metrics(updates, weights, self.payload_bytes) if updates else {})}

    def model(self) -> Weights:
        return self.weights

    def evaluation_model(self) -> Weights:
        aggregator = self.algorithm.aggregator
        params = aggregator.evaluation_weights(self.weights["params"], self.state.get(AGGREGATOR_KEY, {}))
        return {**self.weights, "params": params}

    def server_state(self) -> dict:
        return self.state

    def evaluate_more(self, evaluate) -> dict[str, float]:
        return {}

    def describe(self) -> dict[str, Any]:
        return {}
