"""The federated round loop and what it needs: the trainer, strategies, client training, the wire format,
exchange, checkpoints, sampling, load balancing, callbacks (each module loaded on first use)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import attach, exported_names

_EXPORTS = {
    "..callbacks": ("FederatedCallback",),
    ".checkpoint": ("CheckpointError", "list_checkpoints", "load_checkpoint"),
    ".client": ("ClientStart", "FailurePolicy", "LocalTraining"),
    ".comm": ("FederatedProcessGroup", "get_process_group", "init_federated_process_group"),
    ".load_balance": ("ClientCostModel", "assign_to_processes", "local_work"),
    ".loop": ("run_rounds",),
    ".outcome": ("FederatedTrainOutput", "TrainingFailedError"),
    ".reporting": ("PartitionFilesCallback", "RoundReporter"),
    ".run_folder": ("RunFolderError",),
    "..sampling": ("derive_seed", "sample_clients"),
    ".strategy": ("ServerStrategy", "Strategy"),
    ".trainer": ("FederatedTrainer", "accuracy_metrics", "local_training_arguments"),
}
__getattr__, __dir__ = attach(__name__, _EXPORTS, globals())
__all__ = exported_names(_EXPORTS)

if TYPE_CHECKING:
    from ..callbacks import FederatedCallback
    from ..sampling import derive_seed, sample_clients
    from .checkpoint import CheckpointError, list_checkpoints, load_checkpoint
    from .client import ClientStart, FailurePolicy, LocalTraining
    from .comm import FederatedProcessGroup, get_process_group, init_federated_process_group
    from .load_balance import ClientCostModel, assign_to_processes, local_work
    from .loop import run_rounds
    from .outcome import FederatedTrainOutput, TrainingFailedError
    from .reporting import PartitionFilesCallback, RoundReporter
    from .run_folder import RunFolderError
    from .strategy import ServerStrategy, Strategy
    from .trainer import FederatedTrainer, accuracy_metrics, local_training_arguments
