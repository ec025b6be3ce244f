"""Client perturbations: how a step's direction is obtained from gradient passes.

Every module of this package is imported (and so registered) here: a new perturbation is one new file.
"""

import importlib
import pkgutil

from .gam import GAMPerturbation, OriginalGAMPerturbation
from .lesam import LESAMPerturbation
from .none import NoPerturbation
from .sam import SAMPerturbation
from .smoo import SMOOPerturbation

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "GAMPerturbation", "LESAMPerturbation", "NoPerturbation", "OriginalGAMPerturbation", "SAMPerturbation",
    "SMOOPerturbation",
]
