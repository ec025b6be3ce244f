"""The fast path's switch (``runtime.switch``): read from ``HF_FEDFLAT_FAST_PATH``, per mechanism, per thread."""

from __future__ import annotations

import pytest

from hf_fedflat import runtime


def test_the_switch_reads_the_environment_and_is_per_thread():
    import threading

    from hf_fedflat.runtime import switch

    assert switch.parse(None) == switch.parse("1") == switch.ON and switch.ON.enabled
    assert switch.parse("0") == switch.OFF and not any(switch.OFF(m) for m in runtime.MECHANISMS)
    partial = switch.parse("-heap_trim, -select_rows")
    assert not partial("heap_trim") and not partial("select_rows") and partial("optimizer_reuse") and not partial.enabled
    with pytest.raises(ValueError, match="HF_FEDFLAT_FAST_PATH"):
        switch.parse("-no_such_mechanism")
    with pytest.raises(ValueError, match="unknown mechanisms"):
        with runtime.fast_path(without=["no_such_mechanism"]):
            pass
    before = runtime.current()
    seen = {}
    with runtime.fast_path(False):
        assert not runtime.enabled("optimizer_reuse")
        thread = threading.Thread(target=lambda: seen.update(other=runtime.current()))
        thread.start()
        thread.join()
        with runtime.fast_path(without=["heap_trim"]):
            assert runtime.enabled("optimizer_reuse") and not runtime.enabled("heap_trim")
        assert runtime.current() == switch.OFF
    assert seen["other"] == before and runtime.current() == before  # another thread keeps its own setting
