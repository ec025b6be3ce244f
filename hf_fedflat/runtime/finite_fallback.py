"""The perturbations' non-finite fallback, written once around the gradient oracle, without a host-device sync on
accelerators.

A perturbation asks for gradients at offsets it computes from earlier ones (SAM's ``rho g/||g||``). When an offset
is not finite (``||g||`` overflowed: an fp16 step the loss scaler then skips), the step's direction is the first
pass's gradient instead, and the perturbation's workspace entries stay as they were before the step. The test is
where the offset is, so that it never costs a sync:

* **on the host** (CPU tensors): each offset is tested when it is asked for (the sum of its elements, read on the
  host: one pass over it). A non-finite one stops the perturbation there: the step takes the first pass's loss and
  gradient (running that pass at ``w`` if the perturbation had run none);
* **on an accelerator** a host read would wait for every kernel queued so far: a non-finite offset is replaced by
  zeros (its pass runs at ``w``), the tests are collected in a 0-dim bool tensor, and at the end ``torch.where``
  picks the direction or the first pass's gradient (and the new or the old workspace entries).

Both give the same values, finite or not (``tests/runtime/test_finite_fallback.py`` runs the accelerator's path on the
CPU through :func:`device_side_checks`, and counts its host reads: none). The accelerator's path does more work only on
a step that falls back: it runs every pass and discards them. An offset whose elements are finite but sum past the
largest float counts as not finite (no usable step moves the weights that far).

A :class:`~hf_fedflat.algorithms.base.FixedOffsetPerturbation` is not wrapped: its offset is fixed for the client's
round, so the piece validates it once, in ``begin`` (LESAM's estimate), not at every step.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator
from typing import Any

import torch

from ..algorithms.base import FixedOffsetPerturbation, GradientOracle, Perturbation

Tensor = torch.Tensor

__all__ = ["direction", "device_side_checks"]


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


class _Unusable(Exception):
    """The host path's stop: an offset was not finite."""


class _Guarded:
    """The oracle the perturbation sees: ``oracle`` with each offset tested (see the module docstring)."""

    def __init__(self, oracle: GradientOracle, on_host: bool):
        self._oracle = oracle
        self._on_host = on_host
        #: accelerator path: every offset finite so far (0-dim bool tensor; None before the first offset)
        self.ok: Tensor | None = None
        #: ``(loss, gradient)`` of the first pass, and the gradient's version counter then
        self.first: tuple[Tensor, Tensor] | None = None
        self._first_version = 0

    def __call__(self, offset: Tensor | None) -> tuple[Tensor, Tensor]:
        if offset is not None:
            offset = self._usable(offset)
        return self._keep_first(*self._oracle(offset))

    def hessian_vector_product(self, vector: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        loss, gradient, product = self._oracle.hessian_vector_product(vector)
        self._keep_first(loss, gradient)
        return loss, gradient, product

    def weights(self) -> Tensor:
        return self._oracle.weights()

    def parameter_mask(self, name_part: str) -> Tensor:
        return self._oracle.parameter_mask(name_part)

    def bias_scale(self) -> float:
        return self._oracle.bias_scale()

    def _usable(self, offset: Tensor) -> Tensor:
        total = offset.sum()
        if self._on_host:
            if not math.isfinite(total.item()):
                raise _Unusable
            return offset
        finite = torch.isfinite(total)
        self.ok = finite if self.ok is None else self.ok & finite
        return torch.where(finite, offset, 0.0)

    def _keep_first(self, loss: Tensor, gradient: Tensor) -> tuple[Tensor, Tensor]:
        if self.first is None:
            self.first = (loss, gradient)
            self._first_version = gradient._version
        return loss, gradient

    def fallback(self) -> tuple[Tensor, Tensor]:
        """The first pass's ``(loss, gradient)``; a pass at ``w`` if none ran yet."""
        return self.first if self.first is not None else self._keep_first(*self._oracle(None))

    def check_first_untouched(self, perturbation: Perturbation) -> None:
        if self.first is not None and self.first[1]._version != self._first_version:
            raise RuntimeError(
                f"The {perturbation.name!r} perturbation wrote into the gradient of its first pass; that gradient is "
                "the step's direction when an offset is not finite: write the result into a new tensor (or into a "
                "later pass's gradient) instead.")


def direction(perturbation: Perturbation, oracle: GradientOracle, workspace: Any,
              device: torch.device) -> tuple[Tensor, Tensor]:
    """``perturbation.direction(oracle, workspace)`` with the non-finite fallback; ``device``: where the step's
    tensors are (the CPU: tested on the host)."""
    if isinstance(perturbation, FixedOffsetPerturbation):
        return perturbation.direction(oracle, workspace)
    guarded = _Guarded(oracle, on_host=device.type == "cpu" and not _mode.device_side)
    entries = dict(workspace) if isinstance(workspace, dict) else None
    try:
        loss, result = perturbation.direction(guarded, workspace)
    except _Unusable:
        if entries is not None:
            workspace.clear()
            workspace.update(entries)
        return guarded.fallback()
    guarded.check_first_untouched(perturbation)
    ok = guarded.ok
    if ok is None:  # the host path, or no offset asked for: nothing to choose
        return loss, result
    first_loss, first_gradient = guarded.first
    if entries is not None:
        for key, value in workspace.items():
            old = entries.get(key)
            if value is not old and isinstance(value, Tensor) and isinstance(old, Tensor):
                workspace[key] = torch.where(ok, value, old)
    if loss is not first_loss:
        loss = torch.where(ok, loss, first_loss)
    return loss, torch.where(ok, result, first_gradient)
