"""Algorithm composition: pieces, registries, presets."""

from .base import (
    Aggregator,
    ClientContext,
    ClientPiece,
    ClientUpdate,
    Correction,
    LocalResult,
    Perturbation,
    RoundSummary,
    global_norm,
)
from .registry import (
    AGGREGATORS,
    CORRECTIONS,
    PERTURBATIONS,
    PRESETS,
    AlgorithmSpec,
    get_preset,
    list_algorithms,
    register_aggregator,
    register_correction,
    register_perturbation,
    register_preset,
)

# Importing the piece packages registers them; presets refer to them by name.
from .. import aggregators as _aggregators  # noqa: E402,F401
from .. import corrections as _corrections  # noqa: E402,F401
from .. import perturbations as _perturbations  # noqa: E402,F401
from . import presets as _presets  # noqa: E402,F401
from .composed import FederatedAlgorithm, build_algorithm, resolve_parts  # noqa: E402

__all__ = [
    "AGGREGATORS", "CORRECTIONS", "PERTURBATIONS", "PRESETS", "Aggregator", "AlgorithmSpec", "ClientContext",
    "ClientPiece", "ClientUpdate", "Correction", "FederatedAlgorithm", "LocalResult", "Perturbation",
    "RoundSummary", "build_algorithm", "get_preset", "global_norm", "list_algorithms", "register_aggregator",
    "register_correction", "register_perturbation", "register_preset", "resolve_parts",
]
