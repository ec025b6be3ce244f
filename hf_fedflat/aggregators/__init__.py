"""Server rules."""

from .mean import MeanAggregator

__all__ = ["MeanAggregator"]
