"""Per-client state (SCAFFOLD's ``c_i``, FedDyn's ``h_i``, ...) behind one small interface.

One model-sized vector per client does not fit in memory for thousands of clients, so the store can
keep it in memory, on disk (one safetensors file per client, written atomically), or keep states in
memory up to a budget and every further one on disk. Checkpoints export the same files.
"""

from __future__ import annotations

import os
import re
import shutil
from abc import ABC, abstractmethod
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

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


def state_nbytes(state: ClientState) -> int:
    """Bytes of the tensors of a client state."""
    return sum(t.numel() * t.element_size() for part in state.values() for t in part.values())


def client_file(directory: str | os.PathLike, client_id: int) -> Path:
    return Path(directory) / f"client-{client_id}.safetensors"


def parse_client_file(name: str) -> int | None:
    """The client id of a ``client-<id>.safetensors`` file name; None for any other name."""
    match = _FILE.match(name)
    return int(match.group(1)) if match else None


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


def _owns_storage(tensor: torch.Tensor) -> bool:
    return tensor.storage_offset() == 0 and tensor.untyped_storage().nbytes() == tensor.nbytes


class InMemoryClientStateStore(ClientStateStore):
    def __init__(self):
        self._states: dict[int, dict[str, torch.Tensor]] = {}
        #: bytes of all stored tensors
        self.nbytes = 0

    def get(self, client_id: int) -> ClientState:
        flat = self._states.get(client_id)
        return unflatten_state(flat) if flat is not None else {}

    def put(self, client_id: int, state: ClientState) -> None:
        self.remove(client_id)
        # A view into a larger buffer (a multi-process exchange) is copied, so the buffer is not kept alive;
        # a tensor with a storage of its own is kept as it is (pieces never modify states in place).
        flat = {k: v if _owns_storage(v) else v.clone() for k, v in flatten_state(state).items()}
        self._states[client_id] = flat
        self.nbytes += sum(t.nbytes for t in flat.values())

    def contains(self, client_id: int) -> bool:
        return client_id in self._states

    def nbytes_of(self, client_id: int) -> int:
        return sum(t.nbytes for t in self._states.get(client_id, {}).values())

    def remove(self, client_id: int) -> None:
        old = self._states.pop(client_id, None)
        if old is not None:
            self.nbytes -= sum(t.nbytes for t in old.values())

    def client_ids(self) -> list[int]:
        return sorted(self._states)

    def clear(self) -> None:
        self._states.clear()
        self.nbytes = 0


class DiskClientStateStore(ClientStateStore):
    """One safetensors file per client under ``root``, read and written per client.

    Each write goes to a temporary file renamed over the old one, so a reader (or a kill) never sees a
    half-written state and a hard-linked checkpoint copy is never modified. Writes are not fsynced:
    the live folder is never trusted after a crash (a resume re-imports the checkpoint's copy, which
    ``save_checkpoint`` fsyncs), and an fsync per client per round costs milliseconds each.
    """

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def get(self, client_id: int) -> ClientState:
        path = client_file(self.root, client_id)
        return unflatten_state(load_file(str(path))) if path.exists() else {}

    def put(self, client_id: int, state: ClientState) -> None:
        path = client_file(self.root, client_id)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            save_file(flatten_state(state), str(tmp))
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def contains(self, client_id: int) -> bool:
        return client_file(self.root, client_id).exists()

    def remove(self, client_id: int) -> None:
        client_file(self.root, client_id).unlink(missing_ok=True)

    def client_ids(self) -> list[int]:
        return sorted(int(m.group(1)) for m in map(_FILE.match, os.listdir(self.root)) if m)

    def export_to(self, directory: str | os.PathLike, client_ids: list[int] | None = None) -> None:
        # Files are never modified in place (atomic replace), so a hard link is a consistent snapshot.
        os.makedirs(directory, exist_ok=True)
        for client_id in self.client_ids() if client_ids is None else client_ids:
            source, target = client_file(self.root, client_id), client_file(directory, client_id)
            try:
                os.link(source, target)
            except OSError:
                shutil.copy2(source, target)

    def clear(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)  # (a new run's overwrite_output_dir may have removed it)
        for client_id in self.client_ids():
            client_file(self.root, client_id).unlink()


class AutoClientStateStore(ClientStateStore):
    """Clients' states in memory while they fit in ``memory_budget_bytes``; every further one on disk.

    Memory never holds more than the budget (a state that does not fit goes to its own file under
    ``root``), and nothing is moved in bulk when the budget fills: a store of thousands of
    model-sized states costs the budget in RAM plus one file per client on disk, read and written per
    client. A client keeps one copy: in memory or on disk, never both.
    """

    def __init__(self, root: str | os.PathLike, memory_budget_bytes: float):
        self.root = root
        self.budget = memory_budget_bytes
        self.memory = InMemoryClientStateStore()
        self._disk: DiskClientStateStore | None = None

    @property
    def disk(self) -> DiskClientStateStore:
        if self._disk is None:  # the folder is made (and emptied) only once something spills
            self._disk = DiskClientStateStore(self.root)
            self._disk.clear()
        return self._disk

    @property
    def spilled(self) -> bool:
        """Whether some client's state lives on disk."""
        return self._disk is not None and bool(self._disk.client_ids())

    def get(self, client_id: int) -> ClientState:
        if self.memory.contains(client_id):
            return self.memory.get(client_id)
        return self._disk.get(client_id) if self._disk is not None else {}

    def put(self, client_id: int, state: ClientState) -> None:
        size = state_nbytes(state)
        freed = self.memory.nbytes_of(client_id)
        if self.memory.nbytes - freed + size <= self.budget:
            self.memory.put(client_id, state)
            if self._disk is not None:
                self._disk.remove(client_id)
        else:
            self.memory.remove(client_id)
            self.disk.put(client_id, state)

    def client_ids(self) -> list[int]:
        on_disk = self._disk.client_ids() if self._disk is not None else []
        return sorted(set(self.memory.client_ids()) | set(on_disk))

    def export_to(self, directory) -> None:
        self.memory.export_to(directory)
        if self._disk is not None:
            self._disk.export_to(directory)

    def clear(self) -> None:
        self.memory.clear()
        if self._disk is not None:
            self._disk.clear()


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
