"""Algorithm composition: pieces, their hyperparameters, registries, presets."""

from .affine import D, W, Affine
from .base import (
    Aggregator,
    Capabilities,
    ClientContext,
    ClientPiece,
    ClientUpdate,
    Correction,
    FixedOffsetPerturbation,
    GradientOracle,
    LocalResult,
    MixingRule,
    Perturbation,
    Piece,
    RoundSummary,
    SharpnessAware,
    ascent_offset,
    global_norm,
)
from .hyperparameters import PieceConfig, check_choice, check_number, check_integer, hyperparameter
from .registry import (
    AGGREGATORS,
    CORRECTIONS,
    PERTURBATIONS,
    PRESETS,
    AlgorithmSpec,
    get_preset,
    hyperparameter_fields,
    list_algorithms,
    piece_defaults,
    piece_hyperparameters,
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
from .composed import FederatedAlgorithm, build_algorithm, build_piece, resolve_parts  # noqa: E402

__all__ = [
    "AGGREGATORS", "CORRECTIONS", "PERTURBATIONS", "PRESETS", "Affine", "Aggregator", "AlgorithmSpec", "Capabilities",
    "ClientContext", "ClientPiece", "ClientUpdate", "Correction", "D", "FederatedAlgorithm", "FixedOffsetPerturbation",
    "GradientOracle", "LocalResult", "MixingRule", "Perturbation", "Piece", "PieceConfig", "RoundSummary",
    "SharpnessAware", "W", "ascent_offset", "build_algorithm", "build_piece", "check_choice", "check_number",
    "check_integer", "get_preset", "global_norm", "hyperparameter", "hyperparameter_fields", "list_algorithms",
    "piece_defaults", "piece_hyperparameters", "register_aggregator", "register_correction", "register_perturbation",
    "register_preset", "resolve_parts",
]
