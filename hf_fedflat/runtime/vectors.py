"""Model-sized flat vectors whose memory is reused between clients and rounds instead of freed.

Every client round makes a few vectors of the model's size (its weights, the update, corrected
directions) and the server a few more (the aggregate, new server state). Freed back to glibc, their
memory is split by the small long-lived objects every new client brings (datasets, dataloaders) and
the next vector of that size lands on fresh pages: measured ~400 page faults (~1.3 ms) per client for
FedAvg and ~2,000 for SCAFFOLD on the 0.58M-parameter benchmark CNN, against none for a plain PyTorch
loop. A :class:`VectorRecycler` keeps the storages it hands out and gives one back out as soon as
nothing else refers to it (its storage use count is 1: only the recycler). A vector anyone still holds,
directly or through a view, is never handed out again, so recycling is invisible to the code using it.

Activated for the duration of a federated run (``with recycle_vectors(...)``); outside it, and with the
fast path off (``runtime.switch``), :func:`empty_like` and :func:`zeros_like` are ``torch.empty_like`` /
``torch.zeros_like``.

:class:`BufferPool` applies the same rule to the byte buffers of the cross-process exchange, whose sizes
vary with the clients a process trains.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Iterator

import torch

from .switch import enabled

#: storages the recycler may track, in bytes (beyond it, vectors are ordinary allocations)
RECYCLER_MAX_BYTES = 2**30

_use_count = getattr(torch._C, "_storage_Use_Count", None)


class VectorRecycler:
    """Reusable storages for flat vectors of ``numel`` elements of ``dtype`` on ``device``.

    Storages live in a ring scanned from where the last hand-out stopped, so vectors that die in the
    order they were made (most of them) are found at once. One found in use ``PARK_AFTER`` scans in a
    row (a client's state kept in the store for rounds) is parked, looked at only when the ring has
    nothing free. At most ``max_bytes // vector bytes`` storages are tracked (none for a model too
    large for the budget: page faults are then a negligible share of its compute); past that, the
    longest-parked one is forgotten (left to its holders). The recycler never holds more memory than
    the most vectors alive at once: it keeps the storages of vectors that died, not new ones.
    """

    #: scans an in-use storage survives in the ring before it is parked
    PARK_AFTER = 16

    def __init__(self, numel: int, dtype: torch.dtype, device: torch.device | str, max_bytes: int = RECYCLER_MAX_BYTES):
        self.numel, self.dtype, self.device = numel, dtype, torch.device(device)
        vector_bytes = max(1, numel * torch.empty(0, dtype=dtype).element_size())
        self.capacity = max_bytes // vector_bytes if _use_count is not None else 0
        self._ring: collections.deque[list] = collections.deque()  # [storage, scans found in use]
        self._parked: list[torch.UntypedStorage] = []
        self._lock = threading.Lock()
        self.reused = 0  # vectors handed out from a recycled storage (tests, benchmarks)

    def matches(self, like: torch.Tensor) -> bool:
        return like.numel() == self.numel and like.dtype == self.dtype and like.device == self.device

    def empty(self) -> torch.Tensor:
        """A flat vector with undefined contents."""
        if not self.capacity:
            return torch.empty(self.numel, dtype=self.dtype, device=self.device)
        with self._lock:
            storage = self._find_free()
            if storage is not None:
                self.reused += 1
                return torch.empty(0, dtype=self.dtype, device=self.device).set_(storage, 0, (self.numel,))
            vector = torch.empty(self.numel, dtype=self.dtype, device=self.device)
            if len(self._ring) + len(self._parked) >= self.capacity:
                if self._parked:
                    self._parked.pop(0)
                else:
                    self._ring.popleft()
            self._ring.append([vector.untyped_storage(), 0])
            return vector

    def _find_free(self) -> torch.UntypedStorage | None:
        ring = self._ring
        for _ in range(len(ring)):
            entry = ring[0]
            ring.rotate(-1)  # the entry is now last: the next scan starts after it
            if _use_count(entry[0]._cdata) == 1:  # only this recycler refers to it
                entry[1] = 0
                return entry[0]
            entry[1] += 1
            if entry[1] >= self.PARK_AFTER:
                self._parked.append(ring.pop()[0])
        for index, storage in enumerate(self._parked):
            if _use_count(storage._cdata) == 1:
                del self._parked[index]
                ring.append([storage, 0])
                return storage
        return None


class _ActiveRecycler(threading.local):
    """The recycler of the run in this thread: two runs in two threads of one process keep their own."""

    recycler: VectorRecycler | None = None


_active = _ActiveRecycler()


@contextlib.contextmanager
def recycle_vectors(numel: int, dtype: torch.dtype, device: torch.device | str,
                    max_bytes: int | None = None) -> Iterator[VectorRecycler]:
    """Recycle vectors of this size inside the block (the previous recycler is restored after it).

    ``max_bytes``: memory kept in recycled storages (default ``RECYCLER_MAX_BYTES``; 0 turns recycling off).
    """
    budget = RECYCLER_MAX_BYTES if max_bytes is None else max_bytes
    if not enabled("recycle_vectors"):
        budget = 0
    previous = _active.recycler
    _active.recycler = recycler = VectorRecycler(numel, dtype, device, budget)
    try:
        yield recycler
    finally:
        _active.recycler = previous


def empty(numel: int, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """A flat vector with undefined contents (recycled when a recycler of this size is active)."""
    recycler = _active.recycler
    if recycler is not None and recycler.numel == numel and recycler.dtype == dtype and recycler.device == torch.device(device):
        return recycler.empty()
    return torch.empty(numel, dtype=dtype, device=device)


def empty_like(like: torch.Tensor) -> torch.Tensor:
    """``torch.empty_like`` for flat vectors, recycled when a recycler of this size is active."""
    recycler = _active.recycler
    if recycler is not None and like.dim() == 1 and recycler.matches(like):
        return recycler.empty()
    return torch.empty_like(like)


def zeros_like(like: torch.Tensor) -> torch.Tensor:
    """``torch.zeros_like`` for flat vectors, recycled when a recycler of this size is active."""
    return empty_like(like).zero_()


class BufferPool:
    """Byte buffers (``uint8``) reused once nothing refers to them; for the cross-process exchange.

    Each round a process packs its clients' updates into one buffer and the main process receives one
    per process: ~11 MB per process and round on the benchmark CNN. Fresh, those pages fault in at
    ~15 us each on this VM (measured: packing 11 MB took 38 ms, its padded copy 50 ms, about the
    clients' compute of a 2-process round), reused they cost a memcpy. ``take(n)`` returns the
    first ``n`` bytes of the smallest free storage that holds them (free: the pool is its only
    referrer, the same test as :class:`VectorRecycler`), else of a new one with ``slack`` headroom so
    that a slightly larger message next round still fits. At most ``max_buffers`` storages are kept
    (the least recently taken is forgotten, left to its holders). Requests under ``min_bytes`` are
    ordinary allocations.
    """

    def __init__(self, max_buffers: int = 8, min_bytes: int = 1 << 16, slack: float = 0.125):
        self.max_buffers, self.min_bytes, self.slack = max_buffers, min_bytes, slack
        self._storages: list[torch.UntypedStorage] = []  # least recently taken first
        self._lock = threading.Lock()
        self.reused = 0

    def take(self, nbytes: int) -> torch.Tensor:
        """``nbytes`` bytes with undefined contents."""
        if nbytes < self.min_bytes or _use_count is None or not enabled("buffer_pool"):
            return torch.empty(nbytes, dtype=torch.uint8)
        with self._lock:
            free = [s for s in self._storages if s.nbytes() >= nbytes and _use_count(s._cdata) == 1]
            if free:
                storage = min(free, key=lambda s: s.nbytes())
                self._storages.remove(storage)
                self.reused += 1
            else:
                storage = torch.empty(int(nbytes * (1 + self.slack)), dtype=torch.uint8).untyped_storage()
                if len(self._storages) >= self.max_buffers:
                    self._storages.pop(0)
            self._storages.append(storage)
            return torch.empty(0, dtype=torch.uint8).set_(storage, 0, (nbytes,))
