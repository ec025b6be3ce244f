"""A SuperNode's warm worker: one process per node that keeps the run's experiment built between messages.

Flower's SuperNode starts a new ClientApp process for every message. Building hf_fedflat's experiment there
(importing transformers and datasets, reading and partitioning the data, building the model and the local
``Trainer``) would cost every round several seconds per node. So the ClientApp hands each ``train`` message to this
worker, a process of the same node, started by the first message and reached over a Unix socket in the node's
working folder; it keeps the built experiment, trains the client (:func:`hf_fedflat.flower.node.train_message`) and
answers. Nothing leaves the node: the worker runs beside the SuperNode, under the same user, and the client states it
reads and writes are the node's (its ``state-dir`` files, or the records the ClientApp holds in ``Context.state`` and
passes both ways). The worker exits when its SuperNode does (it watches the SuperNode's process) and belongs to the
SuperNode's process group. ``--node-config "warm-worker=false"`` trains inside each ClientApp process instead (the
same result, slower).

Frames on the socket: an 8-byte length, then that many bytes; a request is a JSON header and the payload, a reply a
JSON header and the update.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import logging
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time

__all__ = ["call_worker", "main", "socket_path"]

_LENGTH = struct.Struct("!Q")


def socket_path(node_key: str, anchor_pid: int) -> str:
    """The worker's socket for this node (short: Unix socket paths are limited to about 100 bytes)."""
    digest = hashlib.sha256(f"{node_key}:{anchor_pid}:{os.getuid()}".encode()).hexdigest()[:16]
    path = os.path.join(tempfile.gettempdir(), f"hf_fedflat_node_{digest}.sock")
    return path if len(path) < 100 else os.path.join("/tmp", os.path.basename(path))


def _send(sock: socket.socket, *parts: bytes) -> None:
    for part in parts:
        sock.sendall(_LENGTH.pack(len(part)))
        sock.sendall(part)


def _receive(sock: socket.socket) -> bytes:
    size = _LENGTH.unpack(_exactly(sock, _LENGTH.size))[0]
    return _exactly(sock, size)


def _exactly(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise ConnectionError("the worker closed the connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def call_worker(path: str, anchor_pid: int, header: dict, blobs: list[bytes], start_timeout: float = 300.0):
    """Send one request (a JSON header and binary parts) to the node's worker, started first when none answers;
    returns ``(reply header, reply parts)``."""
    deadline = time.monotonic() + start_timeout
    started = None
    while True:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.connect(path)
                _send(sock, json.dumps({**header, "parts": len(blobs)}).encode(), *blobs)
                reply = json.loads(_receive(sock))
                return reply, [_receive(sock) for _ in range(reply.pop("parts"))]
        except (FileNotFoundError, ConnectionRefusedError):
            if started is None or started.poll() is not None:
                if started is not None:
                    raise RuntimeError(f"the node's worker exited with status {started.returncode}; see "
                                       f"{path}.log") from None
                if os.path.exists(path):
                    os.unlink(path)  # a dead worker's socket
                with open(path + ".log", "ab") as log:
                    started = subprocess.Popen(
                        [sys.executable, "-m", "hf_fedflat.flower.worker", "--socket", path, "--anchor-pid",
                         str(anchor_pid)], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            if time.monotonic() > deadline:
                raise TimeoutError(f"the node's worker did not answer on {path} within {start_timeout:g}s") from None
            time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def serve(path: str, anchor_pid: int) -> None:
    from .node import train_message

    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(4)
    server.settimeout(2.0)
    try:
        while _alive(anchor_pid):
            try:
                connection, _ = server.accept()
            except socket.timeout:
                continue
            with connection:
                connection.settimeout(None)
                header = json.loads(_receive(connection))
                blobs = [_receive(connection) for _ in range(header.pop("parts"))]
                reply, parts = _handle(train_message, header, blobs)
                _send(connection, json.dumps({**reply, "parts": len(parts)}).encode(), *parts)
    finally:
        server.close()
        if os.path.exists(path):
            os.unlink(path)


def _handle(train_message, header: dict, blobs: list[bytes]) -> tuple[dict, list[bytes]]:
    """One ``train`` message: the reply's header (with this message's log lines, for the node's log) and parts (the
    update, then the states kept in ``Context.state``)."""
    import numpy as np

    log = io.StringIO()
    handler = logging.StreamHandler(log)
    handler.setFormatter(logging.Formatter("%(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    payload, *states = blobs
    records = {k: {"bytes": b, "layout": layout} for (k, layout), b in zip(header["record_layouts"].items(), states)}
    try:
        result = train_message(header["config"], np.frombuffer(payload, dtype=np.uint8), header["run_config"],
                               header["node_config"], records)
    except Exception as error:  # a bug: the ClientApp replies with an error, the worker goes on
        logging.getLogger(__name__).exception("the node's worker failed on this message")
        result = {"error": f"{type(error).__name__}: {error}"}
    finally:
        root.removeHandler(handler)
    update = b""
    if "update" in result:
        array, layout = result.pop("update")
        update = array.tobytes()
        result["layout"] = layout
    result["record_layouts"] = {k: v["layout"] for k, v in records.items()}
    result["log"] = log.getvalue()
    return result, [update, *(v["bytes"] for v in records.values())]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--socket", required=True)
    parser.add_argument("--anchor-pid", type=int, required=True, help="exit when this process (the SuperNode) ends")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import signal

    def stop(signum, frame):
        raise SystemExit(0)  # (the socket file is removed on the way out)

    signal.signal(signal.SIGTERM, stop)
    serve(args.socket, args.anchor_pid)


if __name__ == "__main__":
    main()
