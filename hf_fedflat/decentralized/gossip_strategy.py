"""Decentralized FL as a round strategy: every client keeps its own model, a round ends with gossip.

Round ``t``: the round's clients (a seeded sample, or all of them with
``decentralized_participation="full"``) run their local steps from their own model ``x_i`` with the
algorithm's perturbation and corrections; then every client, trained or not, gossips
``x_i <- sum_j (W^Q)_ij z_j``.

Where things live: the main process owns every local model, in the same client-state store as the
pieces' per-client state (under the key ``"gossip"``), so they spill to disk with
``client_state_store="auto"|"disk"`` and every checkpoint saves them in ``client_states/``. Each
process receives only the models of the clients it trains this round (one scatter) and sends back
their updates (one gather); gossip runs on the main process row by row (see
:func:`~hf_fedflat.aggregators.gossip.gossip_rows`), staging the new models in a second store of the
same kind before they replace the old ones. The run's model (evaluated, checkpointed, saved) is
``x_bar = mean_i x_i``.
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..federation.client import ClientStart
from ..federation.checkpoint import ClientStateTemplate
from ..federation.strategy import NonFiniteServerStep, refuse_non_finite
from ..sampling import derive_seed, sample_clients
from ..federation.wire import client_states_payload, split_payload
from ..state import create_client_state_store
from ..state.store import ClientStateStore
from ..aggregators.gossip import GOSSIP_KEY
from ..algorithms.topology import MixingMatrix

#: settings that must match, besides the federated ones, for a checkpoint to be resumed
DECENTRALIZED_FINGERPRINT_FIELDS = (
    "topology", "topology_degree", "topology_redraw", "topology_edges", "gossip_steps", "decentralized_participation",
)
_LOCAL_EVAL_STREAM = 0x10CA1  # seeds, with (seed, round), the sample of local models evaluated that round
#: with more clients than this (and local_eval_clients unset), DEFAULT_LOCAL_EVAL_SAMPLE local models are evaluated
LOCAL_EVAL_ALL_UP_TO = 20
DEFAULT_LOCAL_EVAL_SAMPLE = 10


class GossipStrategy:
    """The :class:`~hf_fedflat.federation.strategy.Strategy` of decentralized runs (see the module docstring).

    Args:
        algorithm: the run's ``FederatedAlgorithm`` (its aggregator is the gossip aggregator).
        args: the run's arguments.
        store: the client-state store (main process; None elsewhere).
        local_eval_models: how many local models to evaluate (see
            :class:`~hf_fedflat.decentralized.DecentralizedTrainer`); default ``args.local_eval_clients``.

    The local models are evaluated on the evaluation rounds that are also rounds of every
    ``args.local_eval_every_n_rounds`` (and at the last round): ``local_eval_clients`` of them, drawn anew each such
    round from ``(seed, round)``, each loaded in turn into the one model and evaluated on the one evaluation set the
    local Trainer keeps (:mod:`hf_fedflat.runtime.eval_data`). The consensus distance is computed every round and the
    average model evaluated on every evaluation round, whatever the thinning.
    """

    def __init__(self, algorithm, args, store, local_eval_models: int | None = None):
        self.algorithm, self.args, self.store = algorithm, args, store
        self.aggregator = algorithm.aggregator
        self.fingerprint = {name: getattr(args, name) for name in DECENTRALIZED_FINGERPRINT_FIELDS}
        self.initial: dict[str, torch.Tensor] | None = None  # the model every client starts with (main process)
        count = local_eval_models if local_eval_models is not None else getattr(args, "local_eval_clients", None)
        self.local_eval_count = self._local_eval_count(count)
        self.local_eval_every = getattr(args, "local_eval_every_n_rounds", None) or 1
        self._round_index = 0  # the round being applied (its evaluation follows)
        self._average: dict[str, torch.Tensor] | None = None
        self._staging: ClientStateStore | None = None
        self.template = ClientStateTemplate()

    def _local_eval_count(self, count: int | None) -> int:
        num_clients = self.args.num_clients
        if count is None:
            count = num_clients if num_clients <= LOCAL_EVAL_ALL_UP_TO else DEFAULT_LOCAL_EVAL_SAMPLE
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise ValueError(f"local_eval_clients: must be an integer >= 0 (0: only the average model), got {count!r}.")
        return min(count, num_clients)

    def sample_local_eval_clients(self, round_index: int) -> list[int]:
        """``local_eval_clients`` clients drawn from ``(seed, round_index)`` (every client when that is all of them)."""
        num_clients = self.args.num_clients
        if self.local_eval_count >= num_clients:
            return list(range(num_clients))
        rng = np.random.default_rng(derive_seed(self.args.seed, round_index, _LOCAL_EVAL_STREAM))
        return sorted(int(c) for c in rng.choice(num_clients, size=self.local_eval_count, replace=False))

    def local_eval_clients(self, round_index: int) -> list[int]:
        """The clients whose own models an evaluation at round ``round_index`` (0-based) covers: none unless the
        round is one of every ``local_eval_every_n_rounds`` or the last, else :meth:`sample_local_eval_clients`."""
        rounds_done = round_index + 1
        if self.local_eval_count == 0 or (rounds_done % self.local_eval_every and rounds_done != self.args.num_rounds):
            return []
        return self.sample_local_eval_clients(round_index)

    # -- local models on the main process -------------------------------------------------------------
    def local_model(self, client_id: int) -> dict[str, torch.Tensor]:
        """Client ``client_id``'s own model ``{"params": x_i[, "buffers": ...]}`` (main process only)."""
        model = self.store.get(client_id).get(GOSSIP_KEY)
        return model if model is not None else self.initial

    def average_model(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """``x_bar`` in the models' dtypes, and in float64 (one pass over the store)."""
        total: dict[str, torch.Tensor] = {}
        for client_id in range(self.args.num_clients):
            _accumulate(total, self.local_model(client_id))
        return self._cast({key: value / self.args.num_clients for key, value in total.items()})

    def _cast(self, exact: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        return {key: value.to(self.initial[key].dtype) for key, value in exact.items()}, exact

    def consensus_distance(self, average: dict[str, torch.Tensor] | None = None) -> float:
        """``mean_i ||x_i - x_bar||`` over the trainable parameters (float64; main process only)."""
        if average is None:
            average = self.average_model()[1]
        distances = [
            float(torch.linalg.vector_norm(self.local_model(c)["params"].double() - average["params"]))
            for c in range(self.args.num_clients)
        ]
        return float(np.mean(distances))

    def evaluate_local_models(self, evaluate, client_ids: list[int] | None = None) -> dict[str, Any]:
        """Mean and std (over clients) of every eval metric of the clients' own models
        (``evaluate(params, buffers=...)`` gives one model's metrics), and ``local_eval_clients``: which clients.
        ``client_ids`` None: :meth:`sample_local_eval_clients` of the last round applied."""
        values: dict[str, list[float]] = defaultdict(list)
        client_ids = self.sample_local_eval_clients(self._round_index) if client_ids is None else list(client_ids)
        for client_id in client_ids:
            model = self.local_model(client_id)
            for key, value in evaluate(model["params"], buffers=model.get("buffers")).items():
                values[key].append(value)
        out: dict[str, Any] = {"local_eval_clients": client_ids}
        for key, series in values.items():
            name = key.removeprefix("eval_")
            out[f"local_eval_{name}_mean"] = float(np.mean(series))
            out[f"local_eval_{name}_std"] = float(np.std(series))
        return out

    # -- the Strategy protocol --------------------------------------------------------------------------
    def client_state_template(self, initial) -> ClientStateTemplate:
        """Every client holds its own model (``gossip/params``[, ``gossip/buffers``]) once a round has run; its
        pieces' keys once it has trained (all of them, or none yet)."""
        own = {f"{GOSSIP_KEY}/{key}": (tuple(value.shape), value.dtype) for key, value in initial.items()}
        return ClientStateTemplate.from_pieces(self.algorithm.client_pieces, initial["params"], all_together=True,
                                               always=own)

    def start(self, initial, restored) -> None:
        """The local models are in the store (restored with the client states); the checkpoint's global
        slot holds ``x_bar``, recomputed here."""
        self.template = self.client_state_template(initial)
        self.initial = initial
        if restored is not None:
            self._average = self.average_model()[0]

    def sample(self, round_index: int) -> list[int]:
        args = self.args
        if args.decentralized_participation == "full":
            return list(range(args.num_clients))
        return sample_clients(args.num_clients, args.num_clients_per_round, args.seed, round_index)

    def round_limit(self, num_rounds: int) -> tuple[int, str | None]:
        """Every round: a decentralized run claims no privacy budget (server plug-ins such as +dp are refused)."""
        return num_rounds, None

    def learning_rate(self, round_index: int, learning_rate: float) -> float:
        """The run's schedule: the gossip rule drives no client learning rate (server plug-ins are refused)."""
        return learning_rate

    def send(self, comm, shares: list[list[int]], round_index: int) -> dict:
        """main -> each process: the own models (and states) of the clients it trains this round."""
        per_process = None
        if comm.is_main:
            per_process = [client_states_payload({c: self._state_with_model(c) for c in share}) for share in shares]
        return {"states": split_payload(comm.scatter_tensors(per_process))[3]}

    def _state_with_model(self, client_id: int) -> dict:
        state = self.store.get(client_id)
        state.setdefault(GOSSIP_KEY, self.initial)
        return state

    def client_start(self, client_id: int, received: dict) -> ClientStart:
        state = dict(received["states"].get(client_id, {}))
        own = state.pop(GOSSIP_KEY)
        return ClientStart(own["params"], {}, state, own.get("buffers"))

    def apply(self, round_index: int, learning_rate: float, updates, weights) -> dict[str, Any]:
        """Gossip (a failed client gossips its model unchanged); consensus, spectral gap and bytes sent.
        A non-finite new local model refuses the whole round (:class:`NonFiniteServerStep`): no model changes."""
        self._round_index = round_index
        matrix, exact_average = self._gossip(round_index, updates)
        self._average, exact_average = self._cast(exact_average)
        steps = matrix.weights.copy()
        np.fill_diagonal(steps, 0.0)
        model_bytes = sum(t.numel() * t.element_size() for t in self._average.values())
        return {
            "consensus_distance": self.consensus_distance(exact_average),
            "spectral_gap": matrix.spectral_gap,
            # every gossip step, each client receives the model of each of its neighbours
            "bytes_gossip": int(np.count_nonzero(steps)) * model_bytes * self.aggregator.gossip_steps,
        }

    def _gossip(self, round_index: int, updates) -> tuple[MixingMatrix, dict[str, torch.Tensor]]:
        """Mix, then write the new local models and the trained clients' new states.

        Returns the round's matrix and ``x_bar`` in float64 (summed while the new models are written)."""
        matrix = self.aggregator.mixing_matrix(round_index)
        trained = {u.client_id: u for u in updates}

        def load(client_id: int) -> dict[str, torch.Tensor]:  # z_j
            model = self.local_model(client_id)
            update = trained.get(client_id)
            if update is None:
                return model
            z = dict(model, params=model["params"] + update.delta.to(model["params"].dtype))
            if update.buffers is not None:
                z["buffers"] = update.buffers
            return z

        staging = self._staging_store()
        for client_id, mixed in self.aggregator.mix(matrix, load):
            try:  # before any new model replaces an old one: a refused round leaves every x_i as it was
                refuse_non_finite("gossip step", {f"client {client_id}'s new model": mixed})
            except NonFiniteServerStep:
                staging.clear()
                raise
            staging.put(client_id, {GOSSIP_KEY: mixed})
        total: dict[str, torch.Tensor] = {}
        for client_id in range(self.args.num_clients):
            state = self.store.get(client_id)
            if client_id in trained:
                self.template.check_live(client_id, trained[client_id].state)
                state.update(trained[client_id].state)
            state[GOSSIP_KEY] = staging.get(client_id)[GOSSIP_KEY]
            self.store.put(client_id, state)
            _accumulate(total, state[GOSSIP_KEY])
        staging.clear()
        return matrix, {key: value / self.args.num_clients for key, value in total.items()}

    def _staging_store(self) -> ClientStateStore:
        if self._staging is None:
            args = self.args
            store_dir = Path(args.client_state_dir or os.path.join(args.output_dir, "client_states"))
            self._staging = create_client_state_store(
                args.client_state_store, store_dir.with_name(store_dir.name + "_gossip_staging"),
                args.client_state_memory_mb,
            )
        return self._staging

    def model(self) -> dict[str, torch.Tensor]:
        return self._average if self._average is not None else self.average_model()[0]

    def evaluation_model(self) -> dict[str, torch.Tensor]:
        return self.model()

    def server_state(self) -> dict:
        return {}

    def evaluate_more(self, evaluate) -> dict[str, Any]:
        """The local models' evaluation of the round just applied (see :meth:`local_eval_clients`), or nothing."""
        client_ids = self.local_eval_clients(self._round_index)
        return self.evaluate_local_models(evaluate, client_ids) if client_ids else {}

    def describe(self) -> dict[str, Any]:
        return {"decentralized": {
            **self.aggregator.topology.describe(), "gossip_steps": self.aggregator.gossip_steps,
            "participation": self.args.decentralized_participation,
            "model": "x_bar, the average of the clients' own models",
        }}


def _accumulate(total: dict[str, torch.Tensor], model: dict[str, torch.Tensor]) -> None:
    """``total += model`` in float64, key by key (creating the sums on first use)."""
    for key, value in model.items():
        if key not in total:
            total[key] = torch.zeros(value.shape, dtype=torch.float64)
        total[key].add_(value.double())
