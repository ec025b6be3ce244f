"""The federated state of a model: its trainable parameters as one flat vector."""

from __future__ import annotations

import cmath
import contextlib
import math
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from ..runtime import vectors


def all_finite(tensors: torch.Tensor | Iterable[torch.Tensor]) -> bool:
    """True when no element of any floating-point tensor is NaN or +-Inf (other dtypes always are finite).

    ``torch.isfinite(t).all()`` makes several passes over ``t`` and builds a bool copy: about 1.1 ms for
    the 0.6M floats of the benchmark CNN on one CPU thread, twenty times a sum. The check runs on every
    tensor of every client update, so it uses the sum instead: a sum is non-finite whenever one of its
    elements is, and only a non-finite sum (a NaN or Inf, or finite values whose sum overflowed) falls
    back to the exact elementwise test. The answer is always the exact one.
    """
    checked: set[int] = set()
    for tensor in [tensors] if isinstance(tensors, torch.Tensor) else tensors:
        if not (tensor.is_floating_point() or tensor.is_complex()) or tensor.numel() == 0 or id(tensor) in checked:
            continue
        checked.add(id(tensor))  # (a tensor sent both as message and as state is summed once)
        # (the sum read as a Python number: 2 tensor operations; torch.isfinite on it would be 5, each ~10 us when
        # it runs between training steps)
        total = tensor.sum().item()
        if not (cmath.isfinite(total) if tensor.is_complex() else math.isfinite(total)) and not bool(
                torch.isfinite(tensor).all()):
            return False
    return True


class ParameterSpace:
    """Trainable parameters in a fixed order, viewed as one flat vector.

    Everything the algorithms compute (``w``, ``g``, ``Delta``, ``c_i``) is a flat vector over exactly
    these parameters, so one norm and one dot product cover the whole model. Frozen parameters (a
    pretrained backbone under LoRA) are neither perturbed, corrected, sent nor aggregated.
    """

    def __init__(self, model: nn.Module):
        named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        if not named:
            raise ValueError("The model has no trainable parameters (requires_grad=True): nothing to federate.")
        self.names = [name for name, _ in named]
        self.params = [p for _, p in named]
        self.shapes = [tuple(p.shape) for p in self.params]  # (tuples: a view by tuple is ~2x faster than by Size)
        self.numels = [p.numel() for p in self.params]
        self.numel = sum(self.numels)
        self.device = self.params[0].device
        self.dtype = self.params[0].dtype
        self._masks: dict[str, torch.Tensor] = {}

    def parameter_mask(self, name_part: str) -> torch.Tensor:
        """A flat bool vector, True on the entries of the parameters whose name contains ``name_part`` (ASAM's
        ``"weight"``: weight tensors against biases); built on the first call and then the same tensor."""
        mask = self._masks.get(name_part)
        if mask is None:
            mask = torch.cat([torch.full((numel,), name_part in name, dtype=torch.bool, device=self.device)
                              for name, numel in zip(self.names, self.numels)])
            self._masks[name_part] = mask
        return mask

    def split(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Views of ``flat`` shaped like the parameters (no copy)."""
        # split_with_sizes: Tensor.split's Python wrapper costs as much again for a small model
        return [chunk.view(shape) for chunk, shape in zip(flat.split_with_sizes(self.numels), self.shapes)]

    def flatten(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """A copy of the current weights as one flat vector (on the model's device).

        ``out``: a preallocated vector of ``numel`` elements to write into (no allocation per call).
        """
        flats = [p.detach().reshape(-1) for p in self.params]
        return torch.cat(flats, out=out if out is not None else self._new_vector())

    @torch.no_grad()
    def load_(self, flat: torch.Tensor, views: list[torch.Tensor] | None = None) -> None:
        """Write a flat vector into the parameters in place (``views``: ``split(flat)``, if already made)."""
        torch._foreach_copy_(self.params, views if views is not None else self.split(flat.to(self.device, self.dtype)))

    def difference(self, reference: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """``w - reference`` as a flat vector (``out``: as in :meth:`flatten`); the same values as
        ``flatten() - reference`` bit for bit.

        One ``cat`` and one in-place subtraction: per-parameter subtractions straight from the parameters save
        a pass over the vector but cost two splits and a call per parameter, twice the time on a small model
        (64 vs 26 us on workload 6's 4.9k-parameter CNN); the extra pass costs ~7 ms per 100 MB here, against
        client steps of seconds for models of that size. Nothing here is recorded by autograd (detached operands),
        so it needs no ``no_grad`` block: a decorated call costs 16 Python calls, once per client.
        """
        out = self.flatten(out=out)
        return out.sub_(reference.detach())

    @contextlib.contextmanager
    def shifted(self, offset: torch.Tensor, offset_views: list[torch.Tensor] | None = None,
                out_views: list[torch.Tensor] | None = None) -> Iterator[None]:
        """Inside the block the parameters hold ``w + offset``; after it, ``w`` exactly (a perturbed pass).

        ``w + offset`` is written into another vector (``out_views``: the per-parameter views of a
        preallocated one, as :meth:`split` makes them) and the parameters' data point at it for the block,
        while ``w`` stays untouched in the parameters' own storage. Gradients land in ``p.grad`` as usual. Subtracting the offset afterwards
        would not give ``w`` back exactly; saving a copy of ``w``, adding the offset in place and copying
        the copy back did, at three passes over the model instead of one: ~0.4 ms a step on the benchmark
        CNN, 6% of a FedLESAM step whose point is to cost what an ERM step costs.
        """
        shifted_views = out_views if out_views is not None else self.split(self._new_vector())
        with torch.no_grad():
            for p, e, target in zip(self.params, offset_views if offset_views is not None else self.split(offset),
                                    shifted_views):
                torch.add(p, e, out=target)
        originals = [p.data for p in self.params]
        try:
            for p, target in zip(self.params, shifted_views):
                p.data = target
            yield
        finally:
            for p, original in zip(self.params, originals):
                p.data = original

    def grad(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """The current gradients as one flat vector (zeros where a parameter got none); ``out`` as in
        :meth:`flatten`."""
        flats = [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in self.params]
        return torch.cat(flats, out=out if out is not None else self._new_vector())

    def _new_vector(self) -> torch.Tensor:
        return vectors.empty(self.numel, self.dtype, self.device)

    def has_grad(self) -> bool:
        return any(p.grad is not None for p in self.params)

    def clear_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def set_grad_(self, flat: torch.Tensor) -> None:
        """Make ``flat`` the gradient the optimizer will step with (views, no copy)."""
        for p, g in zip(self.params, self.split(flat)):
            p.grad = g

    def named_tensors(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """``{parameter name: tensor}`` of a flat vector (for safetensors files)."""
        return {name: t.contiguous() for name, t in zip(self.names, self.split(flat))}


class BufferSpace:
    """Floating-point buffers (BatchNorm running statistics) as one flat vector.

    Used only when ``batchnorm_buffers="average"``: the server then averages the clients' running
    statistics with the aggregation weights, like FedAvg averages weights. They are never perturbed
    or corrected. Integer buffers (``num_batches_tracked``) stay local: they do not change outputs
    when BatchNorm uses a momentum.
    """

    def __init__(self, model: nn.Module):
        persistent = set(model.state_dict())
        named = [(n, b) for n, b in model.named_buffers() if b.is_floating_point() and n in persistent]
        self.names = [n for n, _ in named]
        self.buffers = [b for _, b in named]
        self.shapes = [b.shape for b in self.buffers]
        self.numels = [b.numel() for b in self.buffers]
        self.numel = sum(self.numels)

    def flatten(self) -> torch.Tensor:
        if not self.buffers:
            return torch.zeros(0)
        return torch.cat([b.detach().reshape(-1).float() for b in self.buffers])

    @torch.no_grad()
    def load_(self, flat: torch.Tensor) -> None:
        for buffer, chunk, shape in zip(self.buffers, flat.split(self.numels), self.shapes):
            buffer.copy_(chunk.view(shape))

    def named_tensors(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        return {name: t.view(shape).contiguous() for name, t, shape in zip(self.names, flat.split(self.numels), self.shapes)}
