"""Tensors in a Flower message: one ``uint8`` array packed as the round loop's wire format packs them (exact for
every dtype, bfloat16 included, and no pickle), its layout a JSON string beside it."""

from __future__ import annotations

import json

import numpy as np
import torch

from ..federation.wire import plan_tensors, unpack_tensors, write_tensors

__all__ = ["pack", "packed_nbytes", "unpack"]


def pack(tensors: dict[str, torch.Tensor]) -> tuple[np.ndarray, str]:
    """``(bytes as a uint8 array, layout as JSON)`` of ``tensors``."""
    plan = plan_tensors(tensors)
    buffer = write_tensors(plan, torch.empty(plan[0]["nbytes"], dtype=torch.uint8))
    return buffer.numpy(), json.dumps(plan[0])


def unpack(array: np.ndarray, layout: str) -> dict[str, torch.Tensor]:
    """The tensors :func:`pack` packed; ``ValueError`` when the layout does not fit the bytes."""
    meta = json.loads(layout)
    buffer = torch.from_numpy(np.ascontiguousarray(array, dtype=np.uint8).reshape(-1).copy())
    if not isinstance(meta, dict) or meta.get("nbytes") != buffer.numel():
        raise ValueError(f"the layout describes {meta.get('nbytes') if isinstance(meta, dict) else '?'} bytes, "
                         f"the message holds {buffer.numel()}")
    for name, dtype, shape, offset, size in meta["entries"]:
        if not isinstance(getattr(torch, dtype, None), torch.dtype) or offset + size > buffer.numel():
            raise ValueError(f"entry {name!r} ({dtype}, {size} bytes at {offset}) does not fit the message")
    return unpack_tensors({**meta, "entries": [(n, d, tuple(s), o, z) for n, d, s, o, z in meta["entries"]]}, buffer)


def packed_nbytes(array: np.ndarray) -> int:
    return int(array.nbytes)
