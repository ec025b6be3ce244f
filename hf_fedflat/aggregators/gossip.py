"""Gossip: the "aggregator" of decentralized runs.

There is no server and no global model: every client keeps its own model ``x_i``, and after local
training every client replaces it by ``x_i <- sum_j (W^Q)_ij z_j`` (``z_j``: client ``j``'s model after
its local round, or ``x_j`` if it did not train; ``Q`` gossip steps). The piece is registered as an
aggregator so that presets compose it like any other server rule (``dfedsam`` = ``sam`` x ``gossip``);
its capability ``decentralized=True`` is what makes a run decentralized (see
:func:`hf_fedflat.federation.trainer_factory.trainer_class_for`), never the algorithm's name.

Reference for the scheme: Sun et al., "Decentralized Federated Averaging", IEEE TPAMI 2022 (DFedAvg);
Lian et al., D-PSGD, NeurIPS 2017.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from ..algorithms.base import (
    TOPOLOGIES, MixingMatrix, MixingRule, PieceConfig, Tensor, Topology, check_choice, check_integer, fail,
    hyperparameter, load_edges, register_aggregator,
)

#: store key of a client's own model (``{"gossip": {"params": x_i, "buffers": ...}}``)
GOSSIP_KEY = "gossip"


def gossip_rows(
    weights, load: Callable[[int], dict[str, Tensor]]
) -> Iterator[tuple[int, dict[str, Tensor]]]:
    """Yield ``(i, sum_j weights[i, j] * load(j))`` for every row ``i`` of the square matrix ``weights`` (an array
    or nested lists), one row at a time.

    Each row reads only the models it mixes (``load`` may read them from disk), so gossip never holds
    more than one row's inputs plus its output, whatever N is. Every value of the dict ``load``
    returns (parameters, buffers) is mixed with the same weights; sums run in the tensors' dtype, in
    increasing ``j`` (deterministic). A row equal to the previous one yields the same (shared, not to
    be modified) tensors without recomputing them: the fully connected topology costs N loads, not N^2.
    """
    matrix = torch.as_tensor(weights, dtype=torch.float64)
    previous_row, mixed = None, None
    for i in range(matrix.shape[0]):
        row = matrix[i]
        if previous_row is not None and torch.equal(row, previous_row):
            yield i, mixed
            continue
        previous_row = row
        mixed = None
        columns = row.nonzero().flatten()
        for j, weight in zip(columns.tolist(), row[columns].tolist()):
            model = load(j)
            if mixed is None:
                mixed = {key: torch.zeros_like(value) for key, value in model.items()}
            for key, value in model.items():
                mixed[key].add_(value, alpha=weight)
        yield i, mixed


def is_decentralized(aggregator) -> bool:
    """Whether an aggregator (class or instance) mixes per-client models instead of updating a global one."""
    return aggregator.capabilities.decentralized


@dataclass
class GossipConfig(PieceConfig):
    topology: str = hyperparameter(
        "random_regular",
        "Decentralized runs: communication graph (ring, full, exponential, random_regular, random_k_out, graph).")
    topology_degree: int = hyperparameter(
        10, "Neighbours per client of random_regular / random_k_out (seed: at most 10).")
    topology_redraw: bool = hyperparameter(
        False, "Draw a new random topology every round (random_regular / random_k_out).")
    topology_edges: str | None = hyperparameter(
        None, "topology=graph: path to a JSON list of undirected edges [[i, j], ...]; Metropolis-Hastings weights.")
    gossip_steps: int = hyperparameter(1, "Gossip steps Q per round (mixing with W^Q).")

    def validate(self) -> None:
        check_choice("topology", self.topology, TOPOLOGIES)
        check_integer("topology_degree", self.topology_degree)
        check_integer("gossip_steps", self.gossip_steps)
        if self.topology == "graph" and not self.topology_edges:
            fail("topology_edges", "topology='graph' needs a JSON file of undirected edges [[i, j], ...].")


@register_aggregator
class GossipAggregator(MixingRule):
    """``x_i <- sum_j (W^Q)_ij z_j`` over the configured topology (Q = ``gossip_steps``).

    Holds the run's :class:`Topology`; :meth:`mixing_matrix` gives the round's ``W`` (whose spectral gap
    the trainer logs) and :meth:`mix` applies ``W^Q``. The Q steps are applied as one matrix ``W^Q``
    (exact zeros stay zeros, so a row still reads only the clients within Q hops).
    """

    name = "gossip"
    config_class = GossipConfig
    run_settings = ("num_clients", "seed")

    def __init__(self, config: GossipConfig | None = None, num_clients: int = 1, seed: int = 0):
        super().__init__(config)
        c = self.config
        edges = load_edges(c.topology_edges) if c.topology == "graph" else None
        self.topology = Topology(c.topology, num_clients, degree=c.topology_degree, redraw=c.topology_redraw,
                                 edges=edges, seed=seed)
        self.gossip_steps = c.gossip_steps

    def mixing_matrix(self, round_index: int) -> MixingMatrix:
        return self.topology.matrix(round_index)

    def mix(
        self, matrix: MixingMatrix, load: Callable[[int], dict[str, Tensor]]
    ) -> Iterator[tuple[int, dict[str, Tensor]]]:
        """The new model of every client, row by row (see :func:`gossip_rows`)."""
        return gossip_rows(matrix.power(self.gossip_steps), load)
