"""Per-client state (SCAFFOLD's ``c_i``, FedDyn's ``h_i``, ...) behind one small interface.

One model-sized vector per client does not fit in memory for thousands of clients, so the store can
keep it in memory, on disk (one safetensors file per client, written atomically), or start in memory
and spill to disk past a budget. Checkpoints export the same files.
"""

from __future__ import annotations

import os
import re
import shutil
from abc import ABC, abstractmethod
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..io import atomic_save_safetensors

ClientState = dict[str, dict[str, torch.Tensor]]  # piece name -> key -> tensor
_FILE = re.compile(r"^client-(\d+)\.safetensors$")
SEPARATOR = "/"


def flatten_state(state: ClientState) -> dict[str, torch.Tensor]:
    return {f"{piece}{SEPARATOR}{key}": t.detach().to("cpu").contiguous()
            for piece, part in state.items() for key, t in part.items()}


def unflatten_state(flat: dict[str, torch.Tensor]) -> ClientState:
    state: ClientState = {}
    for name, tensor in flat.items():
        piece, key = name.split(SEPARATOR, 1)
        state.setdefault(piece, {})[key] = tensor
    return state


def client_file(directory: str | os.PathLike, client_id: int) -> Path:
    return Path(directory) / f"client-{client_id}.safetensors"


class ClientStateStore(ABC):
    """``get``/``put`` a client's state; ``export_to``/``import_from`` a folder for checkpoints."""

    @abstractmethod
    def get(self, client_id: int) -> ClientState:
        """The client's state, ``{}`` if it has none yet (CPU tensors)."""

    @abstractmethod
    def put(self, client_id: int, state: ClientState) -> None: ...

    @abstractmethod
    def client_ids(self) -> list[int]: ...

    def __len__(self) -> int:
        return len(self.client_ids())

    def export_to(self, directory: str | os.PathLike) -> None:
        """Write every client's state as ``client-<id>.safetensors`` into ``directory``."""
        os.makedirs(directory, exist_ok=True)
        for client_id in self.client_ids():
            save_file(flatten_state(self.get(client_id)), str(client_file(directory, client_id)))

    def import_from(self, directory: str | os.PathLike) -> None:
        """Replace the contents with the states found in ``directory`` (as written by ``export_to``)."""
        self.clear()
        for entry in sorted(os.listdir(directory)):
            match = _FILE.match(entry)
            if match:
                self.put(int(match.group(1)), unflatten_state(load_file(os.path.join(directory, entry))))

    @abstractmethod
    def clear(self) -> None: ...


class InMemoryClientStateStore(ClientStateStore):
    def __init__(self):
        self._states: dict[int, dict[str, torch.Tensor]] = {}
        self.nbytes = 0

    def get(self, client_id: int) -> ClientState:
        flat = self._states.get(client_id)
        return unflatten_state(flat) if flat is not None else {}

    def put(self, client_id: int, state: ClientState) -> None:
        old = self._states.get(client_id)
        if old is not None:
            self.nbytes -= sum(t.nbytes for t in old.values())
        # Own copies: the tensors may be views into a larger exchange buffer that must not stay alive.
        flat = {k: v.clone() for k, v in flatten_state(state).items()}
        self._states[client_id] = flat
        self.nbytes += sum(t.nbytes for t in flat.values())

    def client_ids(self) -> list[int]:
        return sorted(self._states)

    def clear(self) -> None:
        self._states.clear()
        self.nbytes = 0


class DiskClientStateStore(ClientStateStore):
    """One safetensors file per client under ``root``; each write is atomic (temp file + rename)."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def get(self, client_id: int) -> ClientState:
        path = client_file(self.root, client_id)
        return unflatten_state(load_file(str(path))) if path.exists() else {}

    def put(self, client_id: int, state: ClientState) -> None:
        atomic_save_safetensors(flatten_state(state), client_file(self.root, client_id))

    def client_ids(self) -> list[int]:
        return sorted(int(m.group(1)) for m in map(_FILE.match, os.listdir(self.root)) if m)

    def export_to(self, directory: str | os.PathLike) -> None:
        # Files are never modified in place (atomic replace), so a hard link is a consistent snapshot.
        os.makedirs(directory, exist_ok=True)
        for client_id in self.client_ids():
            source, target = client_file(self.root, client_id), client_file(directory, client_id)
            try:
                os.link(source, target)
            except OSError:
                shutil.copy2(source, target)

    def clear(self) -> None:
        for client_id in self.client_ids():
            client_file(self.root, client_id).unlink()


class AutoClientStateStore(ClientStateStore):
    """In memory until ``memory_budget_bytes`` is exceeded, then everything moves to disk."""

    def __init__(self, root: str | os.PathLike, memory_budget_bytes: float):
        self.root = root
        self.budget = memory_budget_bytes
        self.backend: ClientStateStore = InMemoryClientStateStore()

    @property
    def spilled(self) -> bool:
        return isinstance(self.backend, DiskClientStateStore)

    def get(self, client_id: int) -> ClientState:
        return self.backend.get(client_id)

    def put(self, client_id: int, state: ClientState) -> None:
        self.backend.put(client_id, state)
        if not self.spilled and self.backend.nbytes > self.budget:
            disk = DiskClientStateStore(self.root)
            disk.clear()
            for cid in self.backend.client_ids():
                disk.put(cid, self.backend.get(cid))
            self.backend = disk

    def client_ids(self) -> list[int]:
        return self.backend.client_ids()

    def export_to(self, directory) -> None:
        self.backend.export_to(directory)

    def clear(self) -> None:
        self.backend.clear()


def create_client_state_store(kind: str, root: str | os.PathLike, memory_budget_mb: float = 2048.0) -> ClientStateStore:
    """``kind``: ``memory``, ``disk`` or ``auto``."""
    if kind == "memory":
        return InMemoryClientStateStore()
    if kind == "disk":
        store = DiskClientStateStore(root)
        store.clear()  # a new run starts empty; resume re-imports from the checkpoint
        return store
    if kind == "auto":
        return AutoClientStateStore(root, memory_budget_mb * 2**20)
    raise ValueError(f"client_state_store must be one of memory, disk, auto; got {kind!r}.")
