"""Local (client) training (``ClientTrainer`` loads transformers' ``Trainer`` on first use)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import attach, exported_names

_EXPORTS = {".client_trainer": ("ClientTrainer",), ".parameters": ("BufferSpace", "ParameterSpace")}
__getattr__, __dir__ = attach(__name__, _EXPORTS, globals())
__all__ = exported_names(_EXPORTS)

if TYPE_CHECKING:
    from .client_trainer import ClientTrainer
    from .parameters import BufferSpace, ParameterSpace
