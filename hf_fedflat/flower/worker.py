"""A SuperNode's warm worker: one process per node that keeps the run's experiment built between messages.

Flower's SuperNode starts a new ClientApp process for every message. Building hf_fedflat's experiment there
(importing torch, transformers and datasets, reading and partitioning the data, building the model and the local
``Trainer``) would cost every round several seconds per node. So the ClientApp (:mod:`.relay`, which imports none of
that) hands each ``train`` message to this worker, a process of the same node, started by the first message and
reached over a Unix socket; it keeps the built experiment, trains the client (:func:`hf_fedflat.flower.node.train_message`) and
answers. Nothing leaves the node: the worker runs beside the SuperNode, under the same user, and the client states it
reads and writes are the node's (its ``state-dir`` files, or the records the ClientApp holds in ``Context.state`` and
passes both ways). The worker exits when its SuperNode does (it watches the SuperNode's process) and belongs to the
SuperNode's process group. With ``--node-config "warm-worker=false"`` each message gets a worker of its own that
exits after it (the same result, slower).

The exchange on the socket is :mod:`.relay`'s: a JSON header and binary parts (the payload, the update, the states).
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import socket

from ..federation.run_folder import process_alive
from .relay import receive_frame, send_frames

__all__ = ["main", "serve"]

def serve(path: str, anchor_pid: int, once: bool = False) -> None:
    from .node import train_message

    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    staging = path + ".new"
    if os.path.exists(staging):
        os.unlink(staging)  # (left by a worker that was killed while starting)
    server.bind(staging)
    server.listen(4)
    os.rename(staging, path)  # the socket appears once it listens: a ClientApp that finds it is never refused
    logging.getLogger(__name__).info("the node's worker (pid %d) listens on %s", os.getpid(), path)
    server.settimeout(2.0)
    ended = False  # (its SuperNode gone, its one message answered, or SIGTERM: the log of its start is not needed)
    try:
        while process_alive(anchor_pid):
            try:
                connection, _ = server.accept()
            except socket.timeout:
                continue
            with connection:
                connection.settimeout(None)
                try:
                    header = json.loads(receive_frame(connection))
                    blobs = [receive_frame(connection) for _ in range(header.pop("parts"))]
                    reply, parts = _handle(train_message, header, blobs)
                    send_frames(connection, json.dumps({**reply, "parts": len(parts)}).encode(), *parts)
                except (OSError, ValueError, KeyError) as error:
                    # the ClientApp went away mid-message (Flower stopped it, or its run), or sent garbage: this
                    # message is lost, not the node's worker
                    logging.getLogger(__name__).warning("a message was dropped: %s: %s", type(error).__name__, error)
            if once:
                break
        ended = True
    except SystemExit as stop:
        ended = stop.code == 0
        raise
    finally:
        server.close()
        for leftover in (path, path + ".log", path + ".lock") if ended else (path,):
            if os.path.exists(leftover):
                os.unlink(leftover)


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
    parser.add_argument("--once", action="store_true", help="exit after one message")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import signal

    def stop(signum, frame):
        raise SystemExit(0)  # (the socket file is removed on the way out)

    signal.signal(signal.SIGTERM, stop)
    serve(args.socket, args.anchor_pid, args.once)


if __name__ == "__main__":
    main()
