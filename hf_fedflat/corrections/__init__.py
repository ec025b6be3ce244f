"""Client corrections: affine terms applied to the step direction, each with an optional server half.

Every module of this package is imported (and so registered) here, and every correction it registers is exported
under its class name: a new correction is one new file.
"""

from ..algorithms.base import registered_pieces

_PIECES = registered_pieces(__name__, __path__)
globals().update(_PIECES)
__all__ = sorted(_PIECES)
