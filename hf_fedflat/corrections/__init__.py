"""Client corrections: affine terms applied to the step direction, each with an optional server half.

Every module of this package is imported (and so registered) here: a new correction is one new file.
"""

import importlib
import pkgutil

from .feddyn import FedDynCorrection
from .fedup import FedUpCorrection
from .momentum import MomentumCorrection
from .prox import ProxCorrection
from .scaffold import ScaffoldCorrection

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["FedDynCorrection", "FedUpCorrection", "MomentumCorrection", "ProxCorrection", "ScaffoldCorrection"]
