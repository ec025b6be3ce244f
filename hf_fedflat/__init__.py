"""hf_fedflat: federated fine-tuning with flatness-seeking optimizers, the Hugging Face way."""

__version__ = "0.1.0"

from .algorithms import (  # noqa: E402
    AlgorithmSpec,
    FederatedAlgorithm,
    build_algorithm,
    get_preset,
    list_algorithms,
)
from .config import FedTrainingArguments  # noqa: E402
from .decentralized import DecentralizedTrainer, create_trainer  # noqa: E402  (registers the d* presets)
from .federation import FederatedCallback, FederatedTrainer, FederatedTrainOutput  # noqa: E402
from .federation.comm import init_federated_process_group as init_process_group  # noqa: E402  (entry points call it first)
from .training import ClientTrainer, ParameterSpace  # noqa: E402

__all__ = [
    "AlgorithmSpec", "ClientTrainer", "DecentralizedTrainer", "FedTrainingArguments", "FederatedAlgorithm",
    "FederatedCallback", "FederatedTrainOutput", "FederatedTrainer", "ParameterSpace", "build_algorithm",
    "create_trainer", "get_preset", "init_process_group", "list_algorithms", "__version__",
]
