"""Client perturbations: how a step's direction is obtained from gradient passes.

Every module of this package is imported (and so registered) here, and every perturbation it registers is exported
under its class name: a new perturbation is one new file.
"""

from ..algorithms.base import registered_pieces

_PIECES = registered_pieces(__name__, __path__)
globals().update(_PIECES)
__all__ = sorted(_PIECES)
