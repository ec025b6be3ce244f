"""Local (client) training."""

from .client_trainer import ClientTrainer
from .parameters import BufferSpace, ParameterSpace

__all__ = ["BufferSpace", "ClientTrainer", "ParameterSpace"]
