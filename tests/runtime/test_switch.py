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


SWITCH_NAMES = {"fast_path", "current", "enabled", "FastPath", "switch", "ON", "OFF"}


def _switch_reads(path):
    """``(line, what)`` for each place the module reads the fast-path switch: imports of it from the runtime, and
    ``<anything>.fast_path`` / ``runtime.current`` / ``runtime.enabled`` / ``switch.<x>`` attributes."""
    import ast

    reads = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and "runtime" in node.module.split("."):
            reads += [(node.lineno, alias.name) for alias in node.names
                      if alias.name in SWITCH_NAMES or node.module.endswith("switch")]
        elif isinstance(node, ast.Attribute):
            owner = node.value.id if isinstance(node.value, ast.Name) else None
            if node.attr == "fast_path" or (owner in ("runtime", "switch") and node.attr in SWITCH_NAMES):
                reads.append((node.lineno, f"{owner}.{node.attr}"))
    return reads


def test_only_the_runtime_reads_the_switch(tmp_path):
    from helpers import REPO_ROOT

    package = REPO_ROOT / "hf_fedflat"
    outside = [path for path in sorted(package.rglob("*.py")) if "runtime" not in path.relative_to(package).parts]
    found = {str(path.relative_to(REPO_ROOT)): reads for path in outside if (reads := _switch_reads(path))}
    assert not found, f"the fast-path switch is read outside hf_fedflat/runtime/: {found}"
    # the scan sees what it looks for
    sample = tmp_path / "sample.py"
    sample.write_text("from ..runtime import fast_path\nfrom .. import runtime\nx = trainer.fast_path('a')\n"
                      "y = runtime.current()\n")
    assert [what for _, what in _switch_reads(sample)] == ["fast_path", "trainer.fast_path", "runtime.current"]
