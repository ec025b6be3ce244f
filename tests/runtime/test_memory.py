"""The heap trimmer (``runtime.memory``): freed heap goes back to the OS past its slack, live growth sets off no
trim, and malloc's statistics are read only past the resident slack."""

from __future__ import annotations

import torch

from hf_fedflat.runtime.memory import HeapTrimmer, anonymous_resident_bytes, malloc_in_use_bytes, resident_set_bytes


def test_heap_trimmer_trims_only_past_its_slack():
    eager, lazy = HeapTrimmer(slack_bytes=-1, min_calls_between=1, check_every=1), HeapTrimmer(slack_bytes=2**50)
    if eager._malloc_trim is None:  # no glibc / no /proc: a no-op
        assert not eager.maybe_trim() and eager.trims == 0
        return
    assert eager.maybe_trim() and eager.trims == 1
    assert not lazy.maybe_trim() and lazy.trims == 0
    # freed model-sized buffers are returned: after a trim the resident set is not above its level before
    buffers = [torch.ones(2**18) for _ in range(64)]  # 64 MiB
    del buffers
    before = resident_set_bytes()
    eager.maybe_trim()
    assert resident_set_bytes() <= before
    # at most one trim per min_calls_between checks
    spaced = HeapTrimmer(slack_bytes=-1, min_calls_between=3, check_every=1)
    assert [spaced.maybe_trim() for _ in range(7)] == [True, False, False, True, False, False, True]
    # the resident set is read on the first and every check_every-th call only
    sparse = HeapTrimmer(slack_bytes=-1, min_calls_between=1, check_every=4)
    assert [sparse.maybe_trim() for _ in range(9)] == [True, False, False, False, True, False, False, False, True]


def test_heap_trimmer_does_not_trim_for_live_growth():
    """Memory a run holds (client states, caches) is not freed memory: growing by it must not set off trims."""
    trimmer = HeapTrimmer(slack_bytes=64 * 2**20, min_calls_between=1, check_every=1)
    before = resident_set_bytes()
    held = [torch.ones(2**16) for _ in range(800)]  # 200 MiB of 256 KiB tensors, all still referenced
    if trimmer._malloc_trim is None:  # no glibc / no /proc: a no-op
        assert not trimmer.maybe_trim()
        return
    if malloc_in_use_bytes() is None:  # glibc < 2.33 cannot say what is live: the resident set's growth decides
        assert trimmer.maybe_trim()
        return
    assert resident_set_bytes() - before > 150 * 2**20  # resident growth alone (the old rule) would trim here
    assert not trimmer.maybe_trim() and trimmer.trims == 0
    assert abs(HeapTrimmer.unused_resident_bytes() - trimmer._baseline) < 32 * 2**20
    del held


def test_heap_trimmer_reads_mallocs_statistics_only_past_the_resident_slack():
    """A check reads the resident set first; malloc's statistics (a walk of its free lists) only once the resident
    set grew by the slack, and after live growth the next slack counts from there."""
    if HeapTrimmer()._malloc_trim is None:  # no glibc / no /proc: a no-op
        trimmer = HeapTrimmer(slack_bytes=-1, check_every=1)
        assert not trimmer.maybe_trim() and trimmer.malloc_reads == 0
        return
    # the free heap that earlier tests left goes back to the OS first, so that the live tensors below take fresh
    # pages (malloc would serve them from its free heap, and the resident set would not grow)
    HeapTrimmer(slack_bytes=-1, check_every=1).maybe_trim()
    trimmer = HeapTrimmer(slack_bytes=64 * 2**20, min_calls_between=1, check_every=1)
    assert not any(trimmer.maybe_trim() for _ in range(5)) and trimmer.malloc_reads == 0
    before = anonymous_resident_bytes()
    held = [torch.ones(2**16) for _ in range(1024)]  # 256 MiB of live tensors
    assert anonymous_resident_bytes() - before > 200 * 2**20
    assert not trimmer.maybe_trim() and trimmer.malloc_reads == 1  # read, found live: no trim
    assert not trimmer.maybe_trim() and trimmer.malloc_reads == 1  # the slack counts from the live level now
    del held
    HeapTrimmer(slack_bytes=-1, check_every=1).maybe_trim()  # (no freed heap left behind for later tests)
