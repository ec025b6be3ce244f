"""hf_fedflat: federated fine-tuning with flatness-seeking optimizers, the Hugging Face way.

``import hf_fedflat`` registers every algorithm preset (server and decentralized: plain torch) and
nothing more; the trainer, transformers' ``Trainer``, datasets, timm and peft load on first use of a
name below (PEP 562, :mod:`hf_fedflat._lazy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import attach, exported_names
from . import algorithms as _algorithms  # noqa: F401  (registers every piece and preset)

__version__ = "0.1.0"

_EXPORTS = {
    ".algorithms": ("AlgorithmSpec", "FederatedAlgorithm", "build_algorithm", "get_preset", "list_algorithms"),
    ".config": ("FedTrainingArguments",),
    ".decentralized": ("DecentralizedTrainer",),
    ".federation": ("FederatedCallback", "FederatedTrainer", "FederatedTrainOutput"),
    ".federation.checkpoint": ("CheckpointError",),
    ".federation.comm": ("init_federated_process_group as init_process_group",),
    ".federation.trainer_factory": ("create_trainer",),
    ".federation.outcome": ("TrainingFailedError",),
    ".data.input_checks": ("InvalidInputError",),
    ".training": ("ClientTrainer", "ParameterSpace"),
}
__getattr__, __dir__ = attach(__name__, _EXPORTS, globals())
__all__ = [*exported_names(_EXPORTS), "__version__"]

if TYPE_CHECKING:
    from .algorithms import AlgorithmSpec, FederatedAlgorithm, build_algorithm, get_preset, list_algorithms
    from .config import FedTrainingArguments
    from .decentralized import DecentralizedTrainer
    from .federation import FederatedCallback, FederatedTrainer, FederatedTrainOutput
    from .data.input_checks import InvalidInputError
    from .federation.checkpoint import CheckpointError
    from .federation.comm import init_federated_process_group as init_process_group
    from .federation.trainer_factory import create_trainer
    from .federation.outcome import TrainingFailedError
    from .training import ClientTrainer, ParameterSpace
