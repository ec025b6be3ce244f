"""Decentralized federated learning: topologies, gossip, the gossip round strategy and its trainer.

Importing this package registers the ``gossip`` aggregator and the presets ``dfedavg``, ``dfedavgm``,
``dpsgd``, ``dfedsam`` and ``dfedgam``.
"""

from . import presets as _presets  # noqa: F401
from ..aggregators.gossip import GOSSIP_KEY, GossipAggregator, gossip_rows, is_decentralized
from ..aggregators.topology import (
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
from .strategy import GossipStrategy
from .trainer import DecentralizedTrainer, create_trainer, trainer_class_for

__all__ = [
    "GOSSIP_KEY", "TOPOLOGIES", "DecentralizedTrainer", "GossipAggregator", "GossipStrategy", "MixingMatrix",
    "Topology",
    "create_trainer", "exponential", "fully_connected", "gossip_rows", "is_decentralized", "load_edges",
    "metropolis_hastings", "random_k_out", "random_regular", "ring", "spectral_gap", "trainer_class_for",
    "uniform_neighbour_weights", "validate_mixing_matrix",
]
