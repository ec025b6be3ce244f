"""Atomic, verified checkpoints of a federated run.

Layout of ``<output_dir>/checkpoints/round-<k>/`` (state after k completed rounds):
``global_params.safetensors`` (trainable parameters by name), ``server_state.safetensors``
(``<piece>/<key>``), ``client_states/client-<id>.safetensors``, ``federated_state.json`` (round, history,
run fingerprint, the settings a resume may change only explicitly) and ``manifest.json``, written last:
every file's relative path, size and SHA-256, every tensor's dtype and shape, and the ids of the clients
with state. The folder is assembled under a temporary name, fsynced, and renamed: a kill at any moment
leaves the previous checkpoint intact. Only safetensors and JSON are read back: no pickle.

Nothing read back is trusted. :func:`load_checkpoint` refuses (:class:`CorruptCheckpointError`, naming the
file and the tensor or field) a missing manifest, a file missing from it or not listed in it, a size or
hash that differs, a non-finite tensor, a ``round`` inconsistent with the history, the folder's name or
the manifest. :meth:`RunCheckpoints.restore` then checks the checkpoint against the run, whatever its manifest
says: its run id (a checkpoint of another run is refused), the fingerprint (:mod:`.fingerprint`: the run's
identity never changes; its settings, with :data:`GUARDED_SETTINGS`, only with ``allow_config_change``; a
``num_rounds`` below the checkpoint's round never), and every restored tensor against the run's own template: each
parameter's name, shape and dtype, the server state's keys, shapes and dtypes (those the run's pieces start with),
every client state's keys, shapes and dtypes (:class:`ClientStateTemplate`: what the run's pieces keep) and the
client ids. ``resume_from_checkpoint="latest"`` skips a corrupt newest checkpoint (with a warning saying why) and
takes the newest intact one.

Temporary folders (``.tmp-round-<k>-<pid>``, ``.old-round-<k>-<pid>``) carry their writer's pid; they are cleaned up
only by the process holding the run folder's lock (:mod:`.run_folder`), and only once their writer is gone.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ..io import DiskFullError, check_write_path, disk_full_error, fsync_dir
from ..state.store import ClientStateStore, flatten_state, parse_client_file, unflatten_state
from .fingerprint import identity_names, run_fingerprint
from .run_folder import holds_run_folder, process_alive

#: 3: the run id, the fingerprint's settings tier and the divergence reference
FORMAT_VERSION = 3
STATE_FILE = "federated_state.json"
MANIFEST_FILE = "manifest.json"
PARAMS_FILE = "global_params.safetensors"
SERVER_FILE = "server_state.safetensors"
CLIENTS_DIR = "client_states"
logger = logging.getLogger(__name__)
_ROUND_DIR = re.compile(r"^round-(\d+)$")
_HASH_CHUNK = 1 << 22


class CheckpointError(ValueError):
    """A checkpoint is missing, incomplete, corrupt, or from an incompatible run."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint's files are not what was written (missing, extra, changed, non-finite, inconsistent), or do
    not fit the run although its fingerprint does: ``resume_from_checkpoint="latest"`` falls back past it."""


@dataclass
class Checkpoint:
    path: Path
    round: int
    params: dict[str, torch.Tensor]
    server_state: dict[str, dict[str, torch.Tensor]]
    meta: dict
    manifest: dict = field(default_factory=dict)

    @property
    def client_states_dir(self) -> Path:
        return self.path / CLIENTS_DIR

    @property
    def client_ids(self) -> list[int]:
        """The clients with a state file (verified against the manifest by :func:`load_checkpoint`)."""
        return list(self.manifest.get("client_ids", []))


def list_checkpoints(root: str | os.PathLike) -> list[Path]:
    """Complete-looking checkpoint folders under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), root / name) for name in os.listdir(root) if (m := _ROUND_DIR.match(name))]
    return [path for _, path in sorted(found)]


_LEFTOVER = re.compile(r"^\.(tmp|old)-round-(\d+)-(\d+)$")


def recover_interrupted(root: str | os.PathLike) -> None:
    """Clean up after a writer killed mid-save (there is one writer, the main process of the run holding the
    folder's lock).

    Nothing is touched unless this process holds the lock of the run folder ``root`` is in (its parent), and a
    leftover is touched only once the process named in it is gone (or is this one: one save at a time).
    ``.tmp-round-*`` folders are incomplete and deleted. An ``.old-round-<k>-*`` folder is the previous
    ``round-<k>`` moved aside while a re-written one was swapped in: if the kill came between the two
    renames, it is put back; otherwise it is deleted.
    """
    root = Path(root)
    if not root.is_dir() or not holds_run_folder(root.parent):
        return
    for name in sorted(os.listdir(root)):
        match = _LEFTOVER.match(name)
        if not match:
            continue
        kind, round_index, pid = match.group(1), match.group(2), int(match.group(3))
        if pid != os.getpid() and process_alive(pid):
            logger.warning("Leaving %s: process %d, which writes it, is alive.", root / name, pid)
            continue
        final = root / f"round-{round_index}"
        if kind == "old" and not final.exists():
            os.replace(root / name, final)
            logger.warning("Restored checkpoint %s after an interrupted save.", final)
        else:
            shutil.rmtree(root / name, ignore_errors=True)
    fsync_dir(root)


# --- the manifest ---------------------------------------------------------------------------------------
def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _entries(folder: Path) -> tuple[list[str], list[str]]:
    """``(regular files, anything else)`` under ``folder`` as relative ``/`` paths, symlinks never followed.
    "Anything else": symlinks, devices, folders other than ``client_states/``."""
    files, odd = [], []
    for dirpath, dirnames, filenames in os.walk(folder):
        base = Path(dirpath).relative_to(folder)
        for name in dirnames:
            rel = (base / name).as_posix()
            if rel != CLIENTS_DIR or os.path.islink(os.path.join(dirpath, name)):
                odd.append(rel + "/")
        dirnames[:] = [n for n in dirnames if (base / n).as_posix() == CLIENTS_DIR
                       and not os.path.islink(os.path.join(dirpath, n))]
        for name in filenames:
            full = os.path.join(dirpath, name)
            (files if os.path.isfile(full) and not os.path.islink(full) else odd).append((base / name).as_posix())
    return sorted(files), sorted(odd)


def _tensor_table(path: Path) -> dict[str, dict]:
    """``{tensor name: {"dtype", "shape"}}`` from a safetensors file's header (nothing else is read)."""
    size = path.stat().st_size
    with open(path, "rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            raise ValueError("shorter than a safetensors header")
        (length,) = struct.unpack("<Q", head)
        if length > size - 8:
            raise ValueError(f"header length {length} exceeds the file's {size} bytes")
        header = json.loads(handle.read(length))
    if not isinstance(header, dict):
        raise ValueError("the header is not a JSON object")
    return {name: {"dtype": info["dtype"], "shape": list(info["shape"])} for name, info in sorted(header.items())
            if name != "__metadata__"}


def write_manifest(folder: str | os.PathLike, round_index: int) -> dict:
    """Write ``manifest.json`` for every file now in ``folder`` (call it last): relative path, size, SHA-256;
    every tensor's dtype and shape; the ids of the clients with a state file."""
    folder = Path(folder)
    files, tensors = {}, {}
    for rel in _entries(folder)[0]:
        if rel == MANIFEST_FILE:
            continue
        path = folder / rel
        files[rel] = {"size": path.stat().st_size, "sha256": _sha256(path)}
        if rel.endswith(".safetensors"):
            tensors[rel] = _tensor_table(path)
    client_ids = sorted(cid for rel in files if (cid := _client_id(rel)) is not None)
    manifest = {"format_version": FORMAT_VERSION, "round": round_index, "files": files, "tensors": tensors,
                "client_ids": client_ids}
    with open(folder / MANIFEST_FILE, "w") as handle:
        json.dump(manifest, handle, indent=1)
    return manifest


def _client_id(rel: str) -> int | None:
    directory, _, name = rel.rpartition("/")
    return parse_client_file(name) if directory == CLIENTS_DIR else None


def _corrupt(path: Path, where: str, what: str) -> CorruptCheckpointError:
    """``"Checkpoint <path> is incomplete or corrupt: <file[: tensor or field]> <what>"``."""
    return CorruptCheckpointError(f"Checkpoint {path} is incomplete or corrupt: {where} {what}")


def _read_json(path: Path, rel: str) -> dict:
    try:
        with open(path / rel) as handle:
            value = json.load(handle)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise _corrupt(path, rel, f"cannot be read ({error}).") from None
    if not isinstance(value, dict):
        raise _corrupt(path, rel, "is not a JSON object.")
    return value


def verify_files(path: str | os.PathLike) -> dict:
    """Check every file of the checkpoint folder ``path`` against its ``manifest.json``; return the manifest.

    Refused (:class:`CorruptCheckpointError`, naming the file): no manifest; a file listed but missing, a file
    present but not listed (e.g. a stray ``client-999``), a symlink or other non-file; a size or SHA-256 that
    differs; tensor dtypes or shapes in a header that differ from the manifest's."""
    path = Path(path)
    if not (path / MANIFEST_FILE).is_file():
        raise _corrupt(path, MANIFEST_FILE, (
            "is missing. Every checkpoint lists its files' sizes and SHA-256 in it, written last: a folder "
            "without it was not completely written, was altered, or predates manifests (format "
            f"{FORMAT_VERSION}). Resume from another round-<k> folder."))
    manifest = _read_json(path, MANIFEST_FILE)
    if manifest.get("format_version") != FORMAT_VERSION:
        raise _corrupt(path, f"{MANIFEST_FILE}: field 'format_version'",
                       f"is {manifest.get('format_version')!r}, expected {FORMAT_VERSION}.")
    listed, tensors = manifest.get("files"), manifest.get("tensors")
    if not (isinstance(listed, dict) and isinstance(tensors, dict) and isinstance(manifest.get("client_ids"), list)):
        raise _corrupt(path, MANIFEST_FILE, "lacks its 'files', 'tensors' or 'client_ids' table.")
    for required in (STATE_FILE, PARAMS_FILE, SERVER_FILE):
        if required not in listed:
            raise _corrupt(path, MANIFEST_FILE, f"does not list {required}.")
    files, odd = _entries(path)
    if odd:
        raise _corrupt(path, odd[0], "is not a regular file or folder of a checkpoint (a symlink or a stray folder).")
    present = set(files) - {MANIFEST_FILE}
    if missing := sorted(set(listed) - present):
        raise _corrupt(path, missing[0], f"is missing ({MANIFEST_FILE} lists it: the file was deleted or moved).")
    if unexpected := sorted(present - set(listed)):
        raise _corrupt(path, unexpected[0], f"is not part of the checkpoint ({MANIFEST_FILE} does not list it): a "
                                            "file added after the checkpoint was written.")
    for rel in sorted(listed):
        entry = listed[rel] if isinstance(listed[rel], dict) else {}
        size = (path / rel).stat().st_size
        if size != entry.get("size"):
            raise _corrupt(path, rel, f"has {size} bytes, {MANIFEST_FILE} says {entry.get('size')} (truncated or "
                                      "extended after it was written).")
        if _sha256(path / rel) != entry.get("sha256"):
            raise _corrupt(path, rel, f"has a SHA-256 that differs from the one in {MANIFEST_FILE}: the file changed "
                                      "after the checkpoint was written (e.g. a flipped bit).")
        if rel.endswith(".safetensors"):
            try:
                table = _tensor_table(path / rel)
            except (OSError, ValueError, KeyError, TypeError) as error:
                raise _corrupt(path, rel, f"is not a safetensors file ({error}).") from None
            if table != tensors.get(rel):
                raise _corrupt(path, rel, f"has tensor dtypes or shapes that differ from {MANIFEST_FILE}'s.")
    client_ids = sorted(cid for rel in listed if (cid := _client_id(rel)) is not None)
    if manifest["client_ids"] != client_ids:
        raise _corrupt(path, MANIFEST_FILE, f"lists clients with state {manifest['client_ids']}, the files under "
                                            f"{CLIENTS_DIR}/ are {client_ids}.")
    for rel in listed:
        if rel.startswith(CLIENTS_DIR + "/") and _client_id(rel) is None:
            raise _corrupt(path, rel, "is not a client-<id>.safetensors file.")
    return manifest


def load_tensors(path: Path, rel: str) -> dict[str, torch.Tensor]:
    """The tensors of ``path/rel``, each checked finite (NaN/Inf refused, naming the tensor)."""
    try:
        tensors = load_file(str(path / rel))
    except (OSError, SafetensorError) as error:
        raise _corrupt(path, rel, f"cannot be read as safetensors ({error}).") from None
    for name, tensor in tensors.items():
        if (tensor.is_floating_point() or tensor.is_complex()) and not bool(torch.isfinite(tensor).all()):
            bad = (~torch.isfinite(tensor)).reshape(-1).nonzero()
            raise _corrupt(path, f"{rel}: tensor {name!r}", f"has {bad.numel()} NaN/Inf value(s) (first at flat index "
                                                            f"{int(bad[0])}); every checkpointed tensor is finite.")
    return tensors


def _unflatten(path: Path, rel: str, flat: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    for name in flat:
        if "/" not in name:
            raise _corrupt(path, f"{rel}: tensor {name!r}", "is not named <piece>/<key>.")
    return unflatten_state(flat)


def load_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Read a checkpoint folder after checking it against its manifest (:func:`verify_files`), its
    ``round`` against its history, folder name and manifest, and every loaded tensor finite."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"resume_from_checkpoint: {path} is not a checkpoint folder.")
    manifest = verify_files(path)
    meta = _read_json(path, STATE_FILE)
    if meta.get("format_version") != FORMAT_VERSION:
        raise _corrupt(path, f"{STATE_FILE}: field 'format_version'",
                       f"is {meta.get('format_version')!r}, expected {FORMAT_VERSION}.")
    for name, kind in (("fingerprint", dict), ("settings", dict), ("history", list), ("config_changes", list),
                       ("run_id", str)):
        if not isinstance(meta.get(name), kind):
            raise _corrupt(path, f"{STATE_FILE}: field {name!r}", f"is missing or not a {kind.__name__} (every "
                                                                   "checkpoint records it).")
    round_index = meta.get("round")
    if not isinstance(round_index, int) or isinstance(round_index, bool) or round_index < 1:
        raise _corrupt(path, f"{STATE_FILE}: field 'round'", f"is {round_index!r}; a checkpoint is written after "
                                                             "round 1 or later.")
    folder = _ROUND_DIR.match(path.name)
    history_rounds = [r.get("round") if isinstance(r, dict) else r for r in meta["history"]]
    if round_index != manifest["round"] or (folder and int(folder.group(1)) != round_index) \
            or history_rounds != list(range(1, round_index + 1)):
        raise _corrupt(path, f"{STATE_FILE}: field 'round'", (
            f"is {round_index}, but the folder is {path.name}, {MANIFEST_FILE} says round {manifest['round']} and "
            f"the history holds rounds {_short(history_rounds)}: they must agree (round k after rounds 1..k)."))
    wall = meta.get("wall_seconds")
    if not isinstance(wall, (int, float)) or isinstance(wall, bool) or not math.isfinite(wall) or wall < 0:
        raise _corrupt(path, f"{STATE_FILE}: field 'wall_seconds'", f"is {wall!r}, not a finite number >= 0.")
    params = load_tensors(path, PARAMS_FILE)
    server_state = _unflatten(path, SERVER_FILE, load_tensors(path, SERVER_FILE))
    return Checkpoint(path=path, round=round_index, params=params, server_state=server_state, meta=meta,
                      manifest=manifest)


def _short(values: list, limit: int = 12) -> str:
    return str(values) if len(values) <= limit else f"{values[:limit]}... ({len(values)} in all)"


def save_checkpoint(
    root: str | os.PathLike,
    round_index: int,
    params: dict[str, torch.Tensor],
    server_state: dict[str, dict[str, torch.Tensor]],
    store: ClientStateStore,
    meta: dict,
    save_total_limit: int | None = None,
) -> Path:
    """Write ``round-<round_index>`` atomically, its manifest last; then keep at most ``save_total_limit``
    checkpoints."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    recover_interrupted(root)
    final = root / f"round-{round_index}"
    tmp = root / f".tmp-round-{round_index}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    writing = tmp
    try:
        writing = tmp / PARAMS_FILE
        save_file({k: v.contiguous() for k, v in params.items()}, str(writing))
        writing = tmp / SERVER_FILE
        save_file(flatten_state(server_state), str(writing))
        writing = tmp / CLIENTS_DIR
        store.export_to(writing)
        writing = tmp / STATE_FILE
        with open(writing, "w") as handle:
            json.dump({"format_version": FORMAT_VERSION, "round": round_index, **meta}, handle, indent=2, default=str)
        writing = tmp / MANIFEST_FILE
        write_manifest(tmp, round_index)
        for dirpath, _, filenames in os.walk(tmp):
            for name in filenames:
                with open(os.path.join(dirpath, name), "rb") as handle:
                    os.fsync(handle.fileno())
            fsync_dir(dirpath)
    except Exception as error:  # (a kill leaves the folder to recover_interrupted)
        full = disk_full_error(error, final / writing.relative_to(tmp))
        if full is None:
            raise
        shutil.rmtree(tmp, ignore_errors=True)  # the room it took back; the earlier checkpoints are intact
        raise full from error
    if final.exists():  # re-written after a resume: swap, never leave a gap without a checkpoint
        trash = root / f".old-round-{round_index}-{os.getpid()}"
        os.replace(final, trash)
        os.replace(tmp, final)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(tmp, final)
    fsync_dir(root)
    if save_total_limit is not None and save_total_limit > 0:
        for old in list_checkpoints(root)[:-save_total_limit]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def resume_advice(output_dir: str | os.PathLike) -> str:
    """What a run that stopped (a full disk) resumes from: its last complete checkpoint, and how."""
    found = list_checkpoints(Path(output_dir) / "checkpoints")
    if not found:
        return ("no checkpoint was saved yet: free space, then run again (save_every_n_rounds keeps the rounds "
                "trained).")
    return (f"the last complete checkpoint is {found[-1]} (round {found[-1].name.split('-', 1)[1]}): free space, "
            "then resume with --resume_from_checkpoint latest.")


def advise_resume(error: DiskFullError, output_dir: str | os.PathLike) -> DiskFullError:
    """``error`` with :func:`resume_advice` added, unless it has its own."""
    if error.advice is None:
        error.advice = resume_advice(output_dir)
    return error


def _is_latest(spec: str | bool) -> bool:
    return spec is True or str(spec).lower() in ("latest", "true")


def resolve_checkpoint(spec: str | bool, root: str | os.PathLike) -> Path:
    """A path, or ``"latest"``/``True`` for the newest checkpoint folder under ``root`` (not verified: see
    :meth:`RunCheckpoints.restore`, which falls back past corrupt ones)."""
    if _is_latest(spec):
        recover_interrupted(root)
        found = list_checkpoints(root)
        if not found:
            raise CheckpointError(f"resume_from_checkpoint: no round-<k> checkpoint under {root}.")
        return found[-1]
    return Path(spec)


# --- a run's checkpoints ------------------------------------------------------------------------------------
#: settings a resume changes only with ``allow_config_change`` (then recorded), kept under ``settings``;
#: ``num_rounds`` too, when it is below the checkpoint's round (raising it, to extend a run, is always allowed). The
#: other settings of that kind are in the fingerprint (:mod:`.fingerprint`).
GUARDED_SETTINGS = ("learning_rate", "clients_per_round", "lr_decay_per_round")


def run_settings(args) -> dict:
    """The settings a checkpoint records besides its fingerprint (``clients_per_round``: the per-round count)."""
    return {"num_rounds": args.num_rounds, "learning_rate": args.learning_rate,
            "clients_per_round": args.num_clients_per_round, "lr_decay_per_round": args.lr_decay_per_round}


def _as_json(value):
    return json.loads(json.dumps(value, default=str))


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


Spec = tuple[tuple[int, ...], torch.dtype]


@dataclass
class ClientStateTemplate:
    """What every client state of a run holds, from the run's own pieces (never from the checkpoint).

    Attributes:
        always: ``{"<piece>/<key>": (shape, dtype)}`` every client state holds.
        together: per piece, keys a client state holds all or none of (decentralized runs: a client's own model
            is there before it first trains, its pieces' state after).
        undeclared: pieces that keep client state without declaring its keys (``client_state_keys`` None): their
            tensors are checked only against each other (same dtype and shape for every client).
    """

    always: dict[str, Spec] = field(default_factory=dict)
    together: dict[str, dict[str, Spec]] = field(default_factory=dict)
    undeclared: tuple[str, ...] = ()
    #: the keys the pieces declare: what a trained client's new state holds (besides undeclared pieces')
    piece_keys: frozenset[str] = frozenset()

    @classmethod
    def from_pieces(cls, pieces, params: torch.Tensor, *, all_together: bool = False,
                    always: dict[str, Spec] | None = None) -> "ClientStateTemplate":
        """From the run's client pieces: each declared key is a flat vector like ``params`` (shape and dtype).
        ``all_together``: the pieces' keys go to ``together`` (a client may have none yet), else to ``always``."""
        template = cls(always=dict(always or {}))
        undeclared = []
        spec = (tuple(params.shape), params.dtype)
        for piece in pieces:
            keys = client_state_keys(piece)
            if keys is None:
                undeclared.append(piece.name)
                continue
            if not keys:
                continue
            specs = {f"{piece.name}/{key}": spec for key in keys}
            template.piece_keys = template.piece_keys | set(specs)
            if all_together:
                template.together[piece.name] = specs
            else:
                template.always.update(specs)
        template.undeclared = tuple(undeclared)
        return template

    def check(self, path: Path, rel: str, flat: dict[str, torch.Tensor]) -> None:
        """Refuse (naming ``rel`` and the tensor) a key no piece of the run keeps, a missing one, or another
        shape or dtype."""
        known = {**self.always, **{k: v for group in self.together.values() for k, v in group.items()}}
        for name, tensor in flat.items():
            piece = name.split("/", 1)[0]
            if name not in known and piece not in self.undeclared:
                raise _corrupt(path, f"{rel}: tensor {name!r}", "is kept by no piece of this run.")
            if name in known:
                shape, dtype = known[name]
                if tuple(tensor.shape) != shape or tensor.dtype != dtype:
                    raise _corrupt(path, f"{rel}: tensor {name!r}", (
                        f"is {_dtype_name(tensor.dtype)} of shape {list(tensor.shape)}, this run's pieces keep "
                        f"{_dtype_name(dtype)} of shape {list(shape)}."))
        for name, (shape, dtype) in self.always.items():
            if name not in flat:
                raise _corrupt(path, f"{rel}: tensor {name!r}", (
                    f"is missing; this run's pieces keep it for every client with state ({_dtype_name(dtype)} of "
                    f"shape {list(shape)})."))
        for piece, group in self.together.items():
            present = sorted(name for name in group if name in flat)
            if present and len(present) != len(group):
                missing = sorted(set(group) - set(present))[0]
                raise _corrupt(path, f"{rel}: tensor {missing!r}", f"is missing; the client holds {present[0]!r}, and "
                                                                   f"piece {piece!r} keeps both.")

    def check_live(self, client_id: int, state: dict[str, dict[str, torch.Tensor]]) -> None:
        """A trained client's new state (from its pieces), before it is stored: the keys the pieces declare (a
        piece that returns others is a bug in that piece: its ``client_state_keys`` must list what its ``end``
        returns)."""
        keys = {f"{piece}/{key}" for piece, part in state.items() if piece not in self.undeclared for key in part}
        if keys != self.piece_keys:
            raise RuntimeError(
                f"client {client_id}'s new state holds {sorted(keys)}, the run's pieces declare "
                f"{sorted(self.piece_keys)} (ClientPiece.client_state_keys must list the keys its end() returns).")


def client_state_keys(piece) -> tuple[str, ...] | None:
    """The client-state keys ``piece`` declares; ``()`` for a piece that keeps none (its ``end`` is the base
    one); None when it keeps state without declaring it."""
    keys = getattr(piece, "client_state_keys", None)
    if keys is not None:
        return tuple(keys)
    from ..algorithms.base import ClientPiece

    return () if type(piece).end is ClientPiece.end else None


@dataclass
class Restored:
    """What a run resumes from: the global weights ``{"params"[, "buffers"]}``, the server state, the
    number of completed rounds, the history so far, the wall time spent before, the run id and the divergence
    reference (:mod:`.divergence`)."""

    weights: dict[str, torch.Tensor]
    server_state: dict[str, dict[str, torch.Tensor]]
    round: int
    history: list[dict]
    wall_seconds: float
    run_id: str = ""
    divergence_reference: dict | None = None


class RunCheckpoints:
    """Saves and restores the checkpoints of one run under ``<output_dir>/checkpoints``.

    Args:
        args: the run's arguments (output_dir, save_total_limit, allow_config_change and the fingerprinted and
            guarded settings).
        space, buffer_space: the model's trainable parameters (and averaged buffers, or None) by name.
        extra_fingerprint: further values a resume must match (model and data digests, the strategy's settings;
            see :mod:`.fingerprint`).
        experiment_settings: names in ``extra_fingerprint`` that are settings (changed with
            ``allow_config_change``) rather than the run's identity.
        client_state_template: what the run's client states hold (:class:`ClientStateTemplate`).
    """

    def __init__(self, args, space, buffer_space=None, extra_fingerprint: dict | None = None, *,
                 experiment_settings: tuple[str, ...] = (), client_state_template: ClientStateTemplate | None = None):
        self.args = args
        self.root = os.path.join(args.output_dir, "checkpoints")
        self.save_total_limit = args.save_total_limit
        self.space, self.buffer_space = space, buffer_space
        self.fingerprint = run_fingerprint(args, extra_fingerprint)
        self.identity = identity_names(self.fingerprint, experiment_settings)
        self.client_state_template = client_state_template
        #: this run's id (written into every checkpoint); a resume refuses a checkpoint of another run. None until
        #: known: a resume into a folder without a recorded run id takes the checkpoint's.
        self.run_id: str | None = None
        #: the divergence reference written into every checkpoint (:mod:`.divergence`)
        self.divergence_reference: dict | None = None
        #: settings changed on resume with allow_config_change (carried into every later checkpoint)
        self.config_changes: list[dict] = []

    def save(self, round_number: int, weights: dict[str, torch.Tensor], server_state, store: ClientStateStore,
             history: list[dict], wall_seconds: float) -> Path:
        meta = {"run_id": self.run_id, "fingerprint": self.fingerprint, "settings": run_settings(self.args),
                "config_changes": self.config_changes, "history": history, "wall_seconds": wall_seconds,
                "divergence_reference": self.divergence_reference}
        check_write_path(self.root, self.args.output_dir)  # a planted checkpoints -> /elsewhere link is refused
        tensors = self.space.named_tensors(weights["params"])
        if weights.get("buffers") is not None:
            tensors.update(self.buffer_space.named_tensors(weights["buffers"]))
        try:
            return save_checkpoint(self.root, round_number, tensors, server_state, store, meta, self.save_total_limit)
        except DiskFullError as full:  # the earlier checkpoints are intact: say which one to resume
            raise advise_resume(full, self.args.output_dir)

    def restore(self, spec: str | bool, store: ClientStateStore, dtype: torch.dtype,
                server_state_template: dict | None = None,
                client_state_template: ClientStateTemplate | None = None) -> Restored:
        """Check the checkpoint (a path, or ``"latest"``/``True``) and its fit to this run, load the client
        states into ``store``, return the rest.

        ``server_state_template``: the server state this run's pieces start with; the checkpoint's must have
        the same keys, shapes and dtypes. ``client_state_template``: what every client state holds
        (:class:`ClientStateTemplate`). ``latest`` takes the newest intact checkpoint: a corrupt one is
        skipped with a warning saying why; none intact is a :class:`CheckpointError` listing each."""
        if client_state_template is not None:
            self.client_state_template = client_state_template
        if not _is_latest(spec):
            return self._restore(Path(spec), store, dtype, server_state_template)
        recover_interrupted(self.root)
        found = list_checkpoints(self.root)
        if not found:
            raise CheckpointError(f"resume_from_checkpoint: no round-<k> checkpoint under {self.root}.")
        refused = []
        for path in reversed(found):
            try:
                restored = self._restore(path, store, dtype, server_state_template)
            except CorruptCheckpointError as error:
                logger.warning("resume_from_checkpoint=latest: skipping %s: %s", path.name, error)
                refused.append(f"{path.name}: {error}")
                continue
            if refused:
                logger.warning("Resuming from %s, the newest intact checkpoint (%d newer one(s) refused).",
                               path, len(refused))
            return restored
        raise CheckpointError(f"resume_from_checkpoint=latest: no intact checkpoint under {self.root}; each was "
                              "refused:\n  " + "\n  ".join(refused))

    def _restore(self, path: Path, store: ClientStateStore, dtype: torch.dtype, template: dict | None) -> Restored:
        checkpoint = load_checkpoint(path)
        self._check_run_id(checkpoint)
        self._check_fingerprint(checkpoint)
        weights = self._weights(checkpoint, dtype)
        if template is not None:
            self._check_server_state(checkpoint, template)
        for client_id in checkpoint.client_ids:
            if not 0 <= client_id < self.args.num_clients:
                raise _corrupt(path, f"{CLIENTS_DIR}/client-{client_id}.safetensors",
                               f"client {client_id} does not exist in this run (num_clients={self.args.num_clients}).")
        changes = self._check_settings(checkpoint)
        self._import_client_states(checkpoint, store)
        history = list(checkpoint.meta["history"])
        self.config_changes = list(checkpoint.meta["config_changes"]) + changes
        if changes:
            history[-1] = {**history[-1], "config_changes": changes}
        reference = checkpoint.meta.get("divergence_reference")
        logger.info("Resuming from %s (round %d)", path, checkpoint.round)
        return Restored(weights=weights, server_state=checkpoint.server_state, round=checkpoint.round,
                        history=history, wall_seconds=float(checkpoint.meta["wall_seconds"]),
                        run_id=checkpoint.meta["run_id"], divergence_reference=reference
                        if isinstance(reference, dict) else None)

    def _check_run_id(self, checkpoint: Checkpoint) -> None:
        saved = checkpoint.meta["run_id"]
        if self.run_id is not None and saved != self.run_id:
            raise CheckpointError(
                f"run_id: the checkpoint {checkpoint.path} belongs to run {saved}, the run in {self.args.output_dir} "
                f"is {self.run_id} (its run_status.json); resume one of that run's checkpoints, or start the other run "
                "in its own output_dir.")

    def _check_fingerprint(self, checkpoint: Checkpoint) -> None:
        """Every value this run records must be in the checkpoint; the run's identity must be equal."""
        saved, path = checkpoint.meta["fingerprint"], checkpoint.path
        for name, value in self.fingerprint.items():
            if name not in saved:
                raise _corrupt(path, f"{STATE_FILE}: fingerprint", f"lacks {name!r}, which this run records.")
            if name in self.identity and saved[name] != value:
                raise CheckpointError(
                    f"{name}: the checkpoint {path} was made with {name}={saved[name]!r}, this run has {value!r}; "
                    "it is part of the run's identity (not even --allow_config_change changes it): resume with the "
                    "original settings or start a new output_dir."
                )

    def _weights(self, checkpoint: Checkpoint, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """The flat weights, after checking every tensor's name, shape and dtype against the model."""
        expected = {n: (tuple(s), dtype) for n, s in zip(self.space.names, self.space.shapes)}
        if self.buffer_space is not None:  # averaged buffers are float32 (BufferSpace.flatten)
            expected.update({n: (tuple(s), torch.float32) for n, s in zip(self.buffer_space.names,
                                                                         self.buffer_space.shapes)})
        params, path = checkpoint.params, checkpoint.path
        for name in expected:
            if name not in params:
                raise _corrupt(path, f"{PARAMS_FILE}: tensor {name!r}", "is missing (this model has it).")
        for name, tensor in params.items():
            if name not in expected:
                raise _corrupt(path, f"{PARAMS_FILE}: tensor {name!r}", "is not a parameter of this model.")
            shape, kind = expected[name]
            if tuple(tensor.shape) != shape:
                raise _corrupt(path, f"{PARAMS_FILE}: tensor {name!r}",
                               f"has shape {list(tensor.shape)}, this model's is {list(shape)}.")
            if tensor.dtype != kind:
                raise _corrupt(path, f"{PARAMS_FILE}: tensor {name!r}",
                               f"is {_dtype_name(tensor.dtype)}, this run's is {_dtype_name(kind)}.")
        weights = {"params": torch.cat([params[n].reshape(-1) for n in self.space.names])}
        if self.buffer_space is not None:
            weights["buffers"] = torch.cat([params[n].reshape(-1) for n in self.buffer_space.names]
                                           or [torch.zeros(0)])
        return weights

    def _check_server_state(self, checkpoint: Checkpoint, template: dict) -> None:
        """Same keys, shapes and dtypes as the server state this run's pieces start with."""
        saved, expected, path = flatten_state(checkpoint.server_state), flatten_state(template), checkpoint.path
        for name, reference in expected.items():
            where = f"{SERVER_FILE}: {name!r}"
            if name not in saved:
                raise _corrupt(path, where, f"is missing; this run's pieces ({self.args.fed_algorithm}) keep it, "
                                            f"shape {list(reference.shape)}.")
            if saved[name].shape != reference.shape or saved[name].dtype != reference.dtype:
                raise _corrupt(path, where, (
                    f"is {_dtype_name(saved[name].dtype)} of shape {list(saved[name].shape)}, this run's pieces keep "
                    f"{_dtype_name(reference.dtype)} of shape {list(reference.shape)}."))
        for name in saved:
            if name not in expected:
                raise _corrupt(path, f"{SERVER_FILE}: {name!r}", f"is kept by no piece of this run "
                                                                 f"({self.args.fed_algorithm}).")

    def _check_settings(self, checkpoint: Checkpoint) -> list[dict]:
        """The settings that differ from the checkpoint's (:data:`GUARDED_SETTINGS`, the fingerprint's settings
        tier): refused naming each, or (``allow_config_change``) logged and returned to be recorded. ``num_rounds``
        below the checkpoint's round is refused whatever ``allow_config_change`` says."""
        saved, now, path = checkpoint.meta["settings"], run_settings(self.args), checkpoint.path
        if checkpoint.round > self.args.num_rounds:  # not a setting to change: those rounds are trained and recorded
            raise CheckpointError(
                f"num_rounds: the checkpoint {path} has completed {checkpoint.round} rounds, more than "
                f"num_rounds={self.args.num_rounds}; a run cannot end before a round it has trained. Resume with "
                f"--num_rounds {checkpoint.round} or more, or resume the round-{self.args.num_rounds} checkpoint "
                "(if kept) to end there.")
        changes, reasons = [], []
        for name in GUARDED_SETTINGS:
            if name not in saved:
                raise _corrupt(path, f"{STATE_FILE}: settings", f"lacks {name!r}.")
            if saved[name] != now[name]:
                changes.append({"field": name, "checkpoint": saved[name], "run": now[name]})
                reasons.append(f"{name}: the checkpoint {path} was made with {name}={saved[name]!r}, this run has "
                               f"{now[name]!r}")
        recorded = checkpoint.meta["fingerprint"]
        for name, value in self.fingerprint.items():
            if name not in self.identity and recorded[name] != value:
                changes.append({"field": name, "checkpoint": recorded[name], "run": value})
                reasons.append(f"{name}: the checkpoint {path} was made with {name}={recorded[name]!r}, this run has "
                               f"{value!r}")
        if not changes:
            return []
        if not getattr(self.args, "allow_config_change", False):
            raise CheckpointError("; ".join(reasons) + ". Resume with the checkpoint's values, or pass "
                                  "--allow_config_change true to change them from this round on (recorded in "
                                  "history.json and later checkpoints).")
        for change in changes:
            change["resumed_after_round"] = checkpoint.round
        logger.warning("allow_config_change: resuming with changed settings (recorded in history.json and later "
                       "checkpoints): %s.", "; ".join(reasons))
        return changes

    def _import_client_states(self, checkpoint: Checkpoint, store: ClientStateStore) -> None:
        """Replace the store's states with the checkpoint's, each tensor finite and checked against the run's
        :class:`ClientStateTemplate` (keys, shapes, dtypes), and of the same dtype and shape for every client
        holding that key."""
        store.clear()
        seen: dict[str, tuple[int, torch.dtype, tuple]] = {}
        for client_id in checkpoint.client_ids:
            rel = f"{CLIENTS_DIR}/client-{client_id}.safetensors"
            flat = load_tensors(checkpoint.path, rel)
            state = _unflatten(checkpoint.path, rel, flat)  # every name <piece>/<key>
            for name, tensor in flat.items():
                first = seen.setdefault(name, (client_id, tensor.dtype, tuple(tensor.shape)))
                if (tensor.dtype, tuple(tensor.shape)) != first[1:]:
                    raise _corrupt(checkpoint.path, f"{rel}: tensor {name!r}", (
                        f"is {_dtype_name(tensor.dtype)} of shape {list(tensor.shape)}, client {first[0]}'s is "
                        f"{_dtype_name(first[1])} of shape {list(first[2])}."))
            if self.client_state_template is not None:
                self.client_state_template.check(checkpoint.path, rel, flat)
            store.put(client_id, state)
