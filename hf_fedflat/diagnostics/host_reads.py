"""Counting the reads of tensor values on the host: each one is a host-device sync when the tensor is on a GPU.

``.item()``, ``bool(t)``, ``float(t)``, ``.tolist()``, ``.numpy()``, ``.cpu()``, ``nonzero`` and the like make
the host wait for every kernel launched before them; a training step free of them lets the host queue the next
step's kernels while the GPU runs this one (so the step reads none, and finite checks are batched per client).
:class:`HostReadCounter` counts them through a ``TorchFunctionMode``, on any device: on the CPU, where they
cost nothing, it still tells how many syncs the same code would make on a GPU (combine with
:func:`hf_fedflat.runtime.finite_fallback.device_side_checks` to take the accelerator's code path there).
"""

from __future__ import annotations

import collections
import traceback

import torch
from torch.overrides import TorchFunctionMode

#: torch functions and tensor methods that return (or act on) a value read from the tensor on the host
HOST_READS = frozenset({
    torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.cpu,
    torch.Tensor.__bool__, torch.Tensor.__float__, torch.Tensor.__int__, torch.Tensor.__index__,
    torch.Tensor.__complex__, torch.Tensor.nonzero, torch.nonzero, torch.Tensor.masked_select, torch.masked_select,
    torch.Tensor.unique, torch.unique, torch.Tensor.unique_consecutive, torch.unique_consecutive,
    torch.Tensor.equal, torch.equal, torch.Tensor.allclose, torch.allclose,
})


class HostReadCounter(TorchFunctionMode):
    """``with HostReadCounter() as counter: ...``; ``counter.total`` host reads, ``counter.sites`` where from
    (``{(function, "file:line"): count}``, the innermost frame of this package or of transformers/accelerate)."""

    def __init__(self, record_sites: bool = True):
        super().__init__()
        self.total = 0
        self.record_sites = record_sites
        self.sites: collections.Counter = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in HOST_READS:
            self.total += 1
            if self.record_sites:
                self.sites[(getattr(func, "__name__", str(func)), _call_site())] += 1
        return func(*args, **(kwargs or {}))


def _call_site() -> str:
    for frame in reversed(traceback.extract_stack()):
        if frame.filename == __file__:
            continue
        if any(part in frame.filename for part in ("hf_fedflat", "transformers", "accelerate")):
            return f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}"
    return "?"
