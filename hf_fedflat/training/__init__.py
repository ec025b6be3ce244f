"""Local (client) training."""

from .client_trainer import ClientTrainer
from .parameters import ParameterSpace

__all__ = ["ClientTrainer", "ParameterSpace"]
