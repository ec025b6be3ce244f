"""The warm worker's life: it serves until its SuperNode ends, then removes its socket and the log of its start."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

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


def test_worker_outlives_a_clientapp_that_went_away(tmp_path, monkeypatch):
    """A ClientApp that disconnects mid-message (Flower stopped it, or its run) loses that message, not the node's
    worker: the next message is answered."""
    import json
    import socket

    from hf_fedflat.flower import node
    from hf_fedflat.flower.relay import _exchange, send_frames

    monkeypatch.setattr(node, "train_message", lambda config, *rest: {"num_examples": config["n"]})
    anchor = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    path = str(tmp_path / "node.sock")
    try:
        worker = threading.Thread(target=serve, args=(path, anchor.pid), daemon=True)
        worker.start()
        while not os.path.exists(path) and worker.is_alive():
            worker.join(0.05)
        header = {"config": {"n": 7}, "run_config": {}, "node_config": {}, "record_layouts": {}}
        with socket.socket(socket.AF_UNIX) as sock:  # half a header, then gone
            sock.connect(path)
            sock.sendall(b"\0\0\0\0\0\0\1\0{")
        with socket.socket(socket.AF_UNIX) as sock:  # a whole message, gone before the reply
            sock.connect(path)
            send_frames(sock, json.dumps({**header, "parts": 1}).encode(), b"\1")
        reply, parts = _exchange(path, header, [b""])  # (an empty part: the worker may answer before it is "sent")
        assert reply["num_examples"] == 7 and parts == [b""]
        assert worker.is_alive()
    finally:
        anchor.kill()
        anchor.wait()
    worker.join(60)
    assert not worker.is_alive()


def test_concurrent_first_messages_start_one_worker(tmp_path):
    """The first messages of three runs reach a node at once: one worker is started, and it answers all three."""
    from concurrent.futures import ThreadPoolExecutor

    from hf_fedflat.flower.local import _command_line, _running
    from hf_fedflat.flower.relay import call_worker

    anchor = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    path = str(tmp_path / "node.sock")
    # (a message from a node without its partition-id: the worker answers that it cannot train, all this test needs)
    header = {"config": {}, "run_config": {}, "node_config": {}, "record_layouts": {}}

    def workers():
        return [int(p) for p in os.listdir("/proc") if p.isdigit() and _running(int(p))
                and f"--socket {path} " in _command_line(int(p))]

    try:
        with ThreadPoolExecutor(3) as pool:
            replies = list(pool.map(lambda _: call_worker(path, anchor.pid, header, [b""], start_timeout=300), range(3)))
        assert all("partition-id: missing" in reply["failure"] for reply, _ in replies)
        assert len(workers()) == 1
        with open(path + ".log") as log:  # (what the workers printed: one start, no worker that failed to)
            lines = log.read().splitlines()
        assert [line for line in lines if "worker" in line] == [
            f"the node's worker (pid {workers()[0]}) listens on {path}"]
        assert not any("Error" in line for line in lines)
    finally:
        anchor.kill()
        anchor.wait()
    deadline = time.monotonic() + 60  # (a worker looks at its anchor every 2 s)
    while workers() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not workers()
    assert not any(os.path.exists(path + suffix) for suffix in ("", ".log", ".lock", ".new"))
