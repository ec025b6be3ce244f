"""The federated round loop and what it needs: sampling, exchange, checkpoints, callbacks."""

from .callbacks import FederatedCallback, RoundReporter
from .checkpoint import CheckpointError, list_checkpoints, load_checkpoint
from .comm import FederatedProcessGroup, get_process_group, init_federated_process_group
from .load_balance import ClientCostModel, assign_to_processes, local_work
from .sampling import derive_seed, sample_clients
from .trainer import FederatedTrainer, FederatedTrainOutput, accuracy_metrics, local_training_arguments

__all__ = [
    "CheckpointError", "ClientCostModel", "FederatedCallback", "FederatedProcessGroup", "FederatedTrainOutput",
    "FederatedTrainer", "RoundReporter", "accuracy_metrics", "assign_to_processes", "derive_seed",
    "get_process_group", "init_federated_process_group", "list_checkpoints", "load_checkpoint",
    "local_training_arguments", "local_work", "sample_clients",
]
