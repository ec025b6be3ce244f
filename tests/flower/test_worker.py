"""The warm worker's life: it serves until its SuperNode ends, then removes its socket and the log of its start."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

pytest.importorskip("flwr")

from hf_fedflat.flower.worker import serve  # noqa: E402


def test_worker_ends_with_its_supernode_and_leaves_nothing(tmp_path):
    anchor = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    path = str(tmp_path / "node.sock")
    try:
        open(path + ".log", "w").close()  # (the relay opens it before it starts the worker)
        worker = threading.Thread(target=serve, args=(path, anchor.pid), daemon=True)
        worker.start()
        while not os.path.exists(path) and worker.is_alive():
            worker.join(0.05)
        assert os.path.exists(path)
    finally:
        anchor.kill()
        anchor.wait()
    worker.join(60)  # (it looks at its anchor every 2 s)
    assert not worker.is_alive()
    assert not os.path.exists(path) and not os.path.exists(path + ".log")


def test_worker_that_fails_keeps_its_log(tmp_path, monkeypatch):
    """A worker that stops on an error keeps the log the relay points to; its socket goes."""
    from hf_fedflat.flower import worker

    path = str(tmp_path / "node.sock")
    open(path + ".log", "w").close()

    def broken(pid):
        raise RuntimeError("broken")

    monkeypatch.setattr(worker, "process_alive", broken)
    with pytest.raises(RuntimeError, match="broken"):
        serve(path, os.getpid())
    assert not os.path.exists(path) and os.path.exists(path + ".log")
