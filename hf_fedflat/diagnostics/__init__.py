"""The papers' measurements, available to any run: see :class:`RunDiagnostics` (loaded on first use)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import attach, exported_names

_EXPORTS = {
    ".host_reads": ("HOST_READS", "HostReadCounter"),
    ".landscape": ("filter_normalized_direction", "global_sharpness", "loss_and_gradient", "loss_surface",
                   "plot_loss_surface"),
    ".run": ("RunDiagnostics", "tensor_bytes"),
}
__getattr__, __dir__ = attach(__name__, _EXPORTS, globals())
__all__ = exported_names(_EXPORTS)

if TYPE_CHECKING:
    from .host_reads import HOST_READS, HostReadCounter
    from .landscape import (
        filter_normalized_direction,
        global_sharpness,
        loss_and_gradient,
        loss_surface,
        plot_loss_surface,
    )
    from .run import RunDiagnostics, tensor_bytes
