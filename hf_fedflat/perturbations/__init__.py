"""Client perturbations: how a step's direction is obtained from gradient passes."""

from .none import NoPerturbation
from .sam import SAMPerturbation

__all__ = ["NoPerturbation", "SAMPerturbation"]
