"""The SAM family's "non-finite norm: step along ``g``" fallback, without a host-device sync on accelerators.

A SAM-type step perturbs by ``rho * v / ||v||`` and falls back to the plain gradient when ``||v||`` is not
finite (an fp16 overflow that the loss scaler then skips). Written ``if not torch.isfinite(norm)``, the test
reads the norm on the host: free on the CPU, but on a GPU a sync every step that waits for every kernel
launched so far (issue 20: no sync in the step). So on any device but the CPU the test stays on the device:

* :func:`checked_norm` gives the norm and a 0-dim bool tensor instead of a Python bool;
* :func:`usable_offset` zeroes the offset where it is not finite, so the perturbed pass runs at ``w``;
* :func:`select` takes the step or its fallback with ``torch.where``.

Values are the same as with the host test, finite norm or not (``tests/test_host_syncs.py`` runs the device
path on the CPU through :func:`device_side_checks`); the only difference is work: on a step whose norm is not
finite the device path still runs the perturbed pass(es), and the step it then discards is skipped anyway.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

from .base import Tensor, global_norm

#: ``True``/``False`` from a host read (CPU), or a 0-dim bool tensor kept on the device
Flag = bool | Tensor


class _Mode(threading.local):
    device_side: bool = False


_mode = _Mode()


@contextlib.contextmanager
def device_side_checks() -> Iterator[None]:
    """Inside the block CPU tensors take the accelerator's path too (to test it, or to count its host reads)."""
    previous = _mode.device_side
    _mode.device_side = True
    try:
        yield
    finally:
        _mode.device_side = previous


def _on_host(tensor: Tensor) -> bool:
    return tensor.device.type == "cpu" and not _mode.device_side


def checked_norm(vector: Tensor, nonzero: bool = False) -> tuple[Tensor, Flag]:
    """``(||v||, usable)``: usable when the norm is finite (and, with ``nonzero``, not 0). A Python bool on
    the CPU; a 0-dim bool tensor elsewhere (no host read)."""
    norm = global_norm(vector)
    ok = torch.isfinite(norm)
    if nonzero:
        ok = ok & (norm != 0)
    return norm, (bool(ok) if _on_host(vector) else ok)


def usable_offset(offset: Tensor, ok: Flag) -> Tensor:
    """``offset`` where ``ok``, else zeros (in place; the identity on a finite offset). ``ok`` False never gets
    here: on the host the caller has already fallen back."""
    return offset if ok is True else offset.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)


def select(ok: Flag, value: Tensor, fallback: Tensor | float) -> Tensor:
    """``value`` where ``ok``, else ``fallback`` (a tensor or a number)."""
    return value if ok is True else torch.where(ok, value, fallback)


def both(first: Flag, second: Flag) -> Flag:
    """``first and second``, on the device when either is a tensor."""
    if first is True or second is True:
        return second if first is True else first
    return first & second
