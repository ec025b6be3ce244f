"""A SuperNode's client states, kept on the node: they never travel.

Each state is kept under the round that produced it. The server names, in every message, the round whose state the
client starts from (the last round in which its update was aggregated: a state from a round whose update was left
out, or from rounds the server lost by restarting from an older checkpoint, is never used) and the oldest round it
may still ask for after such a restart (the state as of its latest checkpoint); older states are deleted.

With a ``state-dir`` the states are files (``client-<id>/round-<r>.safetensors``, written atomically), and they
survive a restart of the SuperNode; without one they live in the run's ``Context.state`` on the SuperNode, for as
long as the SuperNode process runs.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..io import atomic_save_safetensors
from ..state.store import flatten_state, unflatten_state
from .packing import pack, unpack

__all__ = ["RECORD_PREFIX", "NodeStates"]

_FILE = re.compile(r"round-(\d+)\.safetensors")
from .relay import RECORD_PREFIX

_KEY = RECORD_PREFIX + "{client}.{round}"


class NodeStates:
    """``get(client, round)``, ``put(client, round, state)``, ``keep(client, rounds)``.

    Args:
        folder: the node's ``state-dir`` (files), or None to keep the states in ``records``.
        records: ``{key: {"bytes": ..., "layout": ...}}``, the states the ClientApp keeps in the run's
            ``Context.state`` (as ``ConfigRecord`` s), used when ``folder`` is None.
    """

    def __init__(self, folder: str | None, records=None):
        self.folder = Path(folder) if folder else None
        self.records = records

    def _file(self, client_id: int, round_number: int) -> Path:
        return self.folder / f"client-{client_id}" / f"round-{round_number}.safetensors"

    def get(self, client_id: int, round_number: int) -> dict | None:
        """The client's state after round ``round_number`` (1-based; 0: before any round, the empty state), or None
        when this node does not hold it."""
        if round_number == 0:
            return {}
        if self.folder is not None:
            path = self._file(client_id, round_number)
            if not path.is_file():
                return None
            from safetensors.torch import load_file

            return unflatten_state(load_file(str(path)))
        record = self.records.get(_KEY.format(client=client_id, round=round_number))
        if record is None:
            return None
        return unflatten_state(unpack(_bytes_array(record["bytes"]), record["layout"]))

    def put(self, client_id: int, round_number: int, state: dict) -> None:
        flat = {k: v.contiguous() for k, v in flatten_state(state).items()}
        if self.folder is not None:
            path = self._file(client_id, round_number)
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_save_safetensors(flat, path)
            return
        array, layout = pack(flat)
        self.records[_KEY.format(client=client_id, round=round_number)] = {"bytes": array.tobytes(), "layout": layout}

    def rounds(self, client_id: int) -> list[int]:
        if self.folder is not None:
            folder = self.folder / f"client-{client_id}"
            names = os.listdir(folder) if folder.is_dir() else []
            return sorted(int(m.group(1)) for m in map(_FILE.fullmatch, names) if m)
        prefix = _KEY.format(client=client_id, round="")
        return sorted(int(k[len(prefix):]) for k in self.records.keys() if k.startswith(prefix))

    def keep(self, client_id: int, rounds: set[int]) -> None:
        """Delete the client's states of every other round."""
        for round_number in self.rounds(client_id):
            if round_number in rounds:
                continue
            if self.folder is not None:
                self._file(client_id, round_number).unlink(missing_ok=True)
            else:
                del self.records[_KEY.format(client=client_id, round=round_number)]


def _bytes_array(data: bytes):
    import numpy as np

    return np.frombuffer(data, dtype=np.uint8)
