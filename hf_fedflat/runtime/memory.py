"""Heap memory of finished clients given back to the OS (glibc's ``malloc_trim``, read through ctypes)."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

#: growth of the unused resident memory since the last heap trim that triggers the next one (see HeapTrimmer)
HEAP_TRIM_SLACK_BYTES = 128 * 2**20


class HeapTrimmer:
    """Give the heap memory freed by finished clients back to the OS once it holds ``slack_bytes`` of it.

    glibc keeps freed blocks in its heap and, past its first frees of a size, serves model-sized tensors
    from the heap instead of fresh mappings. Each client round allocates and frees several model-sized
    vectors (update, state, copies) between long-lived small objects (a new client's dataset and
    dataloader), so with thousands of clients the heap fragments and the resident set grows by a few MB
    per new client although live memory stays flat (measured: +35 MB per round of 10 new SCAFFOLD
    clients, 0.35M parameters, with the disk store; flat with ``malloc_trim``). ``malloc_trim(0)``
    returns the free pages. It runs when the resident memory malloc is not using (anonymous resident
    memory minus the bytes malloc has handed out, glibc's ``mallinfo2``) has grown by ``slack_bytes``
    since the last trim: growth that is live memory (the client states of a stateful algorithm, cached
    client datasets) is not a reason to trim, and trimming for it returned free pages that training then
    faulted back in (SCAFFOLD in the benchmark: 3-4 trims per 20 rounds, ~730 extra page faults per
    round inside local training, 1.148 -> 1.116 of FedAvg's round time without them). Where
    ``mallinfo2`` is missing (glibc < 2.33) the growth of the whole resident set is used. At most one
    trim per ``min_calls_between`` checks (clients): a trim costs ~5 ms plus faulting the allocator's
    working set back in (~10 ms for 100 MB here). The measures are read on the first and then every
    ``check_every``-th call only, and the resident set first: what malloc has handed out (``mallinfo2``, which
    walks every arena's free lists: ~100 us with a fragmented heap, and the caches' contents with it) only once
    the resident set has grown by the slack since the last trim or live growth. Without that order the checks
    alone cost workload 6 (``benchmarks/user_data.py``, a client every ~4 ms) 3-4% of its round time, with no trim in 100 rounds.
    A negative slack trims at every check. The same remedy as Dask's documented ``malloc_trim``. A no-op where
    ``malloc_trim`` does not exist (macOS, Windows, musl).
    """

    def __init__(self, slack_bytes: int = HEAP_TRIM_SLACK_BYTES, min_calls_between: int = 50, check_every: int = 8):
        self.slack_bytes = slack_bytes
        self.min_calls_between = min_calls_between
        self.check_every = check_every
        self.trims = 0
        self._calls = 0
        self._last_trim_call: int | None = None
        self._malloc_trim = _find_malloc_trim()
        self._baseline = self.unused_resident_bytes() if self._malloc_trim is not None else 0
        #: the resident set (anonymous) at the last trim, less the unused growth found since (at a check that found
        #: the rest of the growth live)
        self._resident_baseline = anonymous_resident_bytes() if self._malloc_trim is not None else 0
        #: reads of what malloc has handed out, the expensive half of a check
        self.malloc_reads = 0

    @staticmethod
    def unused_resident_bytes() -> int:
        """Resident memory malloc holds but has not handed out (plus a constant: the other anonymous memory);
        the whole resident set where glibc cannot say what it has handed out."""
        in_use = malloc_in_use_bytes()
        if in_use is None:
            return resident_set_bytes()
        return anonymous_resident_bytes() - in_use

    def maybe_trim(self) -> bool:
        """Trim if the unused resident memory outgrew the slack (and the last trim is long enough ago)."""
        if self._malloc_trim is None:
            return False
        self._calls += 1
        if (self._calls - 1) % self.check_every:
            return False
        if self._last_trim_call is not None and self._calls - self._last_trim_call < self.min_calls_between:
            return False
        resident = anonymous_resident_bytes()
        if self.slack_bytes >= 0 and resident - self._resident_baseline <= self.slack_bytes:
            return False  # the resident set is within its slack: no growth to give back
        self.malloc_reads += 1
        unused_growth = self.unused_resident_bytes() - self._baseline
        if unused_growth <= self.slack_bytes:
            # live growth: the rest of the slack is what the resident set may grow before the next read
            self._resident_baseline = resident - unused_growth
            return False
        self._malloc_trim(0)
        self.trims += 1
        self._last_trim_call = self._calls
        self._baseline = self.unused_resident_bytes()
        self._resident_baseline = anonymous_resident_bytes()
        return True


def _statm_pages() -> list[int]:
    with open("/proc/self/statm", "rb") as handle:
        return [int(field) for field in handle.read().split()]


def resident_set_bytes() -> int:
    """Current resident set size of this process (0 where ``/proc`` does not exist)."""
    try:
        return _statm_pages()[1] * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def anonymous_resident_bytes() -> int:
    """Resident memory not backed by files (heap, anonymous mappings): resident minus shared pages of statm."""
    try:
        pages = _statm_pages()
        return (pages[1] - pages[2]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


@functools.lru_cache(maxsize=None)
def _libc():
    """The C library, or None where it cannot be loaded."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


@functools.lru_cache(maxsize=None)
def _find_mallinfo2():
    mallinfo2 = getattr(_libc(), "mallinfo2", None)
    if mallinfo2 is not None:
        mallinfo2.argtypes, mallinfo2.restype = [], _MallInfo2
    return mallinfo2


def malloc_in_use_bytes() -> int | None:
    """Bytes malloc has handed out and not got back (heap blocks in use + mmapped blocks), all arenas;
    ``None`` without glibc's ``mallinfo2``."""
    mallinfo2 = _find_mallinfo2()
    if mallinfo2 is None:
        return None
    info = mallinfo2()
    return int(info.uordblks) + int(info.hblkhd)


@functools.lru_cache(maxsize=None)
def _find_malloc_trim():
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is None or not resident_set_bytes():
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim
