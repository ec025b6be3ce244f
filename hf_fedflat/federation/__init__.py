"""The federated round loop and what it needs: the trainer, strategies, client training, the wire format,
exchange, checkpoints, sampling, load balancing, callbacks."""

from .callbacks import FederatedCallback, PartitionFilesCallback, RoundReporter
from .checkpoint import CheckpointError, list_checkpoints, load_checkpoint
from .client import ClientStart, FailurePolicy, LocalTraining
from .comm import FederatedProcessGroup, get_process_group, init_federated_process_group
from .load_balance import ClientCostModel, assign_to_processes, local_work
from .loop import FederatedTrainOutput, run_rounds
from ..sampling import derive_seed, sample_clients
from .strategy import ServerStrategy, Strategy
from .trainer import FederatedTrainer, accuracy_metrics, local_training_arguments

__all__ = [
    "CheckpointError", "ClientCostModel", "ClientStart", "FailurePolicy", "FederatedCallback",
    "FederatedProcessGroup", "FederatedTrainOutput", "FederatedTrainer", "LocalTraining", "PartitionFilesCallback",
    "RoundReporter", "ServerStrategy", "Strategy", "accuracy_metrics", "assign_to_processes", "derive_seed",
    "get_process_group", "init_federated_process_group", "list_checkpoints", "load_checkpoint",
    "local_training_arguments", "local_work", "run_rounds", "sample_clients",
]
