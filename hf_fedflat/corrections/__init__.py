"""Client corrections: terms applied to the step direction, each with an optional server half."""

from .scaffold import ScaffoldCorrection

__all__ = ["ScaffoldCorrection"]
