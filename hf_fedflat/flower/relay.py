"""hf_fedflat's Flower ``ClientApp``, light: it imports only the standard library, numpy and flwr.

Flower starts a new ClientApp process for every message; importing torch and hf_fedflat there would cost seconds
per node per round. This module is the ClientApp: it answers the server's ``query`` (which client this node is)
itself and hands each ``train`` message to the node's warm worker (:mod:`.worker`, started by the first message),
which trains the client with hf_fedflat (:func:`hf_fedflat.flower.node.train_message`), passing both ways the client
states the ClientApp keeps in the run's ``Context.state``. With ``--node-config "warm-worker=false"`` each message gets
a worker of its own, which exits after it (the same result, slower).

A Flower App loads it by its file (``hf-fedflat flower-app`` writes the two lines that do), so that importing it does
not import the ``hf_fedflat`` package; ``hf_fedflat.flower.client_app`` is the same ClientApp for Python users.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
from typing import Any

__all__ = ["RECORD_PREFIX", "client_app", "partition_id_of", "receive_frame", "send_frames"]

#: the keys of client states in ``Context.state`` (the states of a node without a state-dir)
RECORD_PREFIX = "hf_fedflat.client_state."
_LENGTH = struct.Struct("!Q")


# -- the exchange with the worker: frames of an 8-byte length and that many bytes --------------------------------
def send_frames(sock: socket.socket, *parts: bytes) -> None:
    for part in parts:
        sock.sendall(_LENGTH.pack(len(part)))
        if part:  # (an empty last part is complete with its length: the other side may have answered and closed)
            sock.sendall(part)


def receive_frame(sock: socket.socket) -> bytes:
    (size,) = _LENGTH.unpack(_exactly(sock, _LENGTH.size))
    return _exactly(sock, size)


def _exactly(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise ConnectionError("the other side closed the connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def socket_path(node_config: dict[str, Any], anchor_pid: int, extra: str = "") -> str:
    """The worker's socket for this node (short: Unix socket paths are limited to about 100 bytes)."""
    key = f"{node_config.get('state-dir') or ''}:{node_config.get('partition-id')}:{anchor_pid}:{os.getuid()}:{extra}"
    name = f"hf_fedflat_node_{hashlib.sha256(key.encode()).hexdigest()[:16]}.sock"
    path = os.path.join(tempfile.gettempdir(), name)
    return path if len(path) < 100 else os.path.join("/tmp", name)


def call_worker(path: str, anchor_pid: int, header: dict, blobs: list[bytes], start_timeout: float = 600.0,
                once: bool = False):
    """One request (a JSON header and binary parts) to the node's worker, started first when none answers (``once``:
    a worker that exits after this request); returns ``(reply header, reply parts)``."""
    try:
        return _exchange(path, header, blobs)
    except (FileNotFoundError, ConnectionRefusedError):
        pass
    # The ClientApps of concurrent runs reach a new node at the same time: one of them starts the worker while the
    # others wait on the lock, then find it. (A worker's socket appears once it listens, so one that refuses is a
    # dead worker's.)
    with open(path + ".lock", "ab") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return _exchange(path, header, blobs)
        except (FileNotFoundError, ConnectionRefusedError):
            if os.path.exists(path):
                os.unlink(path)
        with open(path + ".log", "ab") as log:  # (what the worker prints outside of a message)
            started = subprocess.Popen(
                [sys.executable, "-m", "hf_fedflat.flower.worker", "--socket", path, "--anchor-pid", str(anchor_pid),
                 *(["--once"] if once else [])], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        print(f"hf_fedflat: started the node's worker (pid {started.pid}) on {path}", flush=True)  # (the node's log)
        deadline = time.monotonic() + start_timeout
        while not os.path.exists(path):
            if started.poll() is not None:
                raise RuntimeError(f"the node's worker exited with status {started.returncode}; see {path}.log")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the node's worker did not answer on {path} within {start_timeout:g}s")
            time.sleep(0.05)
    return _exchange(path, header, blobs)


def _exchange(path: str, header: dict, blobs: list[bytes]):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(path)
        send_frames(sock, json.dumps({**header, "parts": len(blobs)}).encode(), *blobs)
        reply = json.loads(receive_frame(sock))
        return reply, [receive_frame(sock) for _ in range(reply.pop("parts"))]


def partition_id_of(node_config: dict[str, Any]) -> int:
    """The node's ``partition-id`` (its client id); ``ValueError`` with the one line to show when it is missing."""
    value = node_config.get("partition-id")
    if value is None or value == "":
        raise ValueError("node-config partition-id: missing; start the SuperNode with --node-config "
                         "\"partition-id=<this node's client id> ...\".")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"node-config partition-id: {value!r} is not an integer.") from None


def _train(msg, context, train=None, settings=None) -> dict[str, Any]:
    """The reply's parts (``hf_fedflat.flower.node.train_message``): trained by ``train`` in this process when given,
    else by the node's warm worker (``warm-worker=false``: by a worker started for this message alone); the states
    kept in ``Context.state`` pass both ways."""
    import numpy as np
    from flwr.app import ConfigRecord

    config = dict(msg.content["config"])
    payload = msg.content["arrays"]["payload"].numpy()
    run_config = dict(context.run_config if settings is None else settings)
    node_config = dict(context.node_config)
    records = {k: {"bytes": bytes(v["bytes"]), "layout": str(v["layout"])} for k, v in context.state.items()
               if k.startswith(RECORD_PREFIX)}
    before = set(records)
    if train is not None:
        result = train(config, payload, run_config, node_config, records)
    else:
        anchor = os.getppid()  # the SuperNode's process that started this ClientApp: the worker ends with it
        once = str(node_config.get("warm-worker", "true")).lower() in ("false", "0", "no")
        path = socket_path(node_config, anchor, f"{os.getpid()}" if once else "")
        header = {"config": config, "run_config": run_config, "node_config": node_config,
                  "record_layouts": {k: v["layout"] for k, v in records.items()}}
        reply, blobs = call_worker(path, anchor, header,
                                   [payload.tobytes(), *(records[k]["bytes"] for k in header["record_layouts"])],
                                   once=once)
        if reply.get("log"):
            print(reply["log"], end="", flush=True)  # the worker's lines for this message, in the node's log
        if "error" in reply:
            raise RuntimeError(f"the node's worker failed: {reply['error']}")
        update, *states = blobs
        records = {k: {"bytes": b, "layout": layout} for (k, layout), b in zip(reply["record_layouts"].items(), states)}
        result = {k: v for k, v in reply.items() if k in ("failure", "num_examples")}
        if "layout" in reply:
            result["update"] = (np.frombuffer(update, dtype=np.uint8), reply["layout"])
    for key in before - set(records):
        del context.state[key]
    for key, value in records.items():
        context.state[key] = ConfigRecord(value)
    return result


def client_app(settings: dict[str, Any] | None = None, train_here=None):
    """hf_fedflat's Flower ``ClientApp`` (the App's ``clientapp`` component). ``settings``: the run's settings
    (``hf_fedflat.flower.arguments_settings(training_args, ...)``, the same the server's strategy is given) instead of
    the App's ``run_config``; ``train_here``: train each message in this process with this function
    (``hf_fedflat.flower.node.train_message``) instead of the node's worker."""
    from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp

    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        result = _train(msg, context, train_here, settings)
        if "failure" in result:
            return Message(RecordDict({"config": ConfigRecord({"failure": result["failure"]})}), reply_to=msg)
        array, layout = result["update"]
        return Message(RecordDict({
            "arrays": ArrayRecord({"update": Array(array)}),
            "config": ConfigRecord({"layout": layout, "failure": ""}),
            "metrics": MetricRecord({"num-examples": result["num_examples"]}),
        }), reply_to=msg)

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        """Which client this node is (the server asks each node once, when it connects)."""
        try:
            config = {"partition-id": partition_id_of(dict(context.node_config))}
        except ValueError as error:
            print(error, file=sys.stderr, flush=True)
            config = {"failure": str(error)}
        return Message(RecordDict({"config": ConfigRecord(config)}), reply_to=msg)

    return app
