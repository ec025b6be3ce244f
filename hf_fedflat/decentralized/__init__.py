"""Decentralized federated learning: topologies, gossip, the gossip round strategy and its trainer.

The ``gossip`` aggregator and the presets ``dfedavg``, ``dfedavgm``, ``dpsgd``, ``dfedsam`` and ``dfedgam`` are
registered with the others (:mod:`hf_fedflat.aggregators`, :mod:`hf_fedflat.algorithms.presets`); the names below
load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import attach, exported_names

_EXPORTS = {
    "..aggregators.gossip": ("GOSSIP_KEY", "GossipAggregator", "gossip_rows", "is_decentralized"),
    "..algorithms.topology": (
        "TOPOLOGIES", "MixingMatrix", "Topology", "exponential", "fully_connected", "load_edges",
        "metropolis_hastings", "random_k_out", "random_regular", "ring", "spectral_gap",
        "uniform_neighbour_weights", "validate_mixing_matrix",
    ),
    ".decentralized_trainer": ("DecentralizedTrainer",),
    ".gossip_strategy": ("GossipStrategy",),
}
__getattr__, __dir__ = attach(__name__, _EXPORTS, globals())
__all__ = exported_names(_EXPORTS)

if TYPE_CHECKING:
    from ..aggregators.gossip import GOSSIP_KEY, GossipAggregator, gossip_rows, is_decentralized
    from ..algorithms.topology import (
        TOPOLOGIES,
        MixingMatrix,
        Topology,
        exponential,
        fully_connected,
        load_edges,
        metropolis_hastings,
        random_k_out,
        random_regular,
        ring,
        spectral_gap,
        uniform_neighbour_weights,
        validate_mixing_matrix,
    )
    from .decentralized_trainer import DecentralizedTrainer
    from .gossip_strategy import GossipStrategy
