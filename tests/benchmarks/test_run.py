"""The benchmark's lock-step: sides take turns round by round and never run at the same time (nothing is timed)."""

from __future__ import annotations

import importlib.util
import sys
import threading

import pytest

from helpers import REPO_ROOT

RUN = REPO_ROOT / "benchmarks" / "run.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("benchmarks_run", RUN)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def fake_side(name, rounds, log, running, fail_at=None):
    """A side that records each round it runs and whether another side was running meanwhile."""

    def side(before_round):
        for round_index in range(rounds):
            before_round(round_index)
            if running:
                log.append(("overlap", name, round_index))
            running.append(name)
            log.append((name, round_index))
            if round_index == fail_at:
                running.remove(name)
                raise RuntimeError(f"{name} failed")
            threading.Event().wait(0.002)  # give another thread the chance to run, were it allowed to
            running.remove(name)
        return name

    return side


def test_sides_take_turns_round_by_round_and_never_overlap(bench):
    log, running = [], []
    sides = {"a": fake_side("a", 3, log, running), "b": fake_side("b", 3, log, running),
             "c": fake_side("c", 1, log, running)}  # c finishes early: the others go on without it
    results = bench.LockStep(["b", "a", "c"]).run(sides)
    assert results == {"a": "a", "b": "b", "c": "c"}
    assert log == [("b", 0), ("a", 0), ("c", 0), ("b", 1), ("a", 1), ("b", 2), ("a", 2)]


def test_a_failing_side_is_reraised_after_the_others_finish(bench):
    log, running = [], []
    sides = {"a": fake_side("a", 3, log, running, fail_at=1), "b": fake_side("b", 3, log, running)}
    with pytest.raises(RuntimeError, match="a failed"):
        bench.LockStep(["a", "b"]).run(sides)
    assert log == [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("b", 2)]
