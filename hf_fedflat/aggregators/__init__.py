"""Server rules, and plug-ins that go in front of any of them (``+fedgh``).

Every module of this package is imported (and so registered) here: a new rule is one new file.
"""

import importlib
import pkgutil

from .fedadam import FedAdamAggregator
from .feddyn import FedDynAggregator, FedSMOOAggregator
from .fedgh import HarmonizedAggregator, gradient_conflicts, harmonize
from .gossip import GossipAggregator
from .fednova import FedNovaAggregator
from .mean import MeanAggregator

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "FedAdamAggregator", "FedDynAggregator", "FedNovaAggregator", "FedSMOOAggregator", "HarmonizedAggregator",
    "GossipAggregator", "MeanAggregator", "gradient_conflicts", "harmonize",
]
