"""Atomic checkpoints of a federated run.

Layout of ``<output_dir>/checkpoints/round-<k>/`` (state after k completed rounds):
``global_params.safetensors`` (trainable parameters by name), ``server_state.safetensors``
(``<piece>/<key>``), ``client_states/client-<id>.safetensors``, and ``federated_state.json``
(round, history, run fingerprint), written last. The folder is assembled under a temporary name,
fsynced, and renamed into place: a kill at any moment leaves the previous checkpoint intact, and a
folder without a readable ``federated_state.json`` is rejected, never half-loaded. Only safetensors
and JSON are read back: no pickle.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ..io import fsync_dir
from ..state.store import ClientStateStore, flatten_state, unflatten_state

FORMAT_VERSION = 1
STATE_FILE = "federated_state.json"
PARAMS_FILE = "global_params.safetensors"
SERVER_FILE = "server_state.safetensors"
CLIENTS_DIR = "client_states"
logger = logging.getLogger(__name__)
_ROUND_DIR = re.compile(r"^round-(\d+)$")


class CheckpointError(ValueError):
    """A checkpoint is missing, incomplete, corrupt, or from an incompatible run."""


@dataclass
class Checkpoint:
    path: Path
    round: int
    params: dict[str, torch.Tensor]
    server_state: dict[str, dict[str, torch.Tensor]]
    meta: dict

    @property
    def client_states_dir(self) -> Path:
        return self.path / CLIENTS_DIR


def list_checkpoints(root: str | os.PathLike) -> list[Path]:
    """Complete-looking checkpoint folders under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), root / name) for name in os.listdir(root) if (m := _ROUND_DIR.match(name))]
    return [path for _, path in sorted(found)]


_LEFTOVER = re.compile(r"^\.(tmp|old)-round-(\d+)-\d+$")


def recover_interrupted(root: str | os.PathLike) -> None:
    """Clean up after a writer killed mid-save (there is one writer, the main process).

    ``.tmp-round-*`` folders are incomplete and deleted. An ``.old-round-<k>-*`` folder is the previous
    ``round-<k>`` moved aside while a re-written one was swapped in: if the kill came between the two
    renames, it is put back; otherwise it is deleted.
    """
    root = Path(root)
    if not root.is_dir():
        return
    for name in sorted(os.listdir(root)):
        match = _LEFTOVER.match(name)
        if not match:
            continue
        kind, round_index = match.group(1), match.group(2)
        final = root / f"round-{round_index}"
        if kind == "old" and not final.exists():
            os.replace(root / name, final)
            logger.warning("Restored checkpoint %s after an interrupted save.", final)
        else:
            shutil.rmtree(root / name, ignore_errors=True)
    fsync_dir(root)


def save_checkpoint(
    root: str | os.PathLike,
    round_index: int,
    params: dict[str, torch.Tensor],
    server_state: dict[str, dict[str, torch.Tensor]],
    store: ClientStateStore,
    meta: dict,
    save_total_limit: int | None = None,
) -> Path:
    """Write ``round-<round_index>`` atomically; then keep at most ``save_total_limit`` checkpoints."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    recover_interrupted(root)
    final = root / f"round-{round_index}"
    tmp = root / f".tmp-round-{round_index}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    save_file({k: v.contiguous() for k, v in params.items()}, str(tmp / PARAMS_FILE))
    save_file(flatten_state(server_state), str(tmp / SERVER_FILE))
    store.export_to(tmp / CLIENTS_DIR)
    with open(tmp / STATE_FILE, "w") as handle:
        json.dump({"format_version": FORMAT_VERSION, "round": round_index, **meta}, handle, indent=2, default=str)
    for dirpath, _, filenames in os.walk(tmp):
        for name in filenames:
            with open(os.path.join(dirpath, name), "rb") as handle:
                os.fsync(handle.fileno())
        fsync_dir(dirpath)
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


def load_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Read a checkpoint folder, checking that it is complete."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"resume_from_checkpoint: {path} is not a checkpoint folder.")
    state_file = path / STATE_FILE
    try:
        with open(state_file) as handle:
            meta = json.load(handle)
    except (OSError, json.JSONDecodeError) as error:
        raise CheckpointError(
            f"Checkpoint {path} is incomplete or corrupt ({STATE_FILE}: {error}). Resume from an earlier "
            f"round-<k> folder instead."
        ) from None
    if meta.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"Checkpoint {path} has format {meta.get('format_version')}, expected {FORMAT_VERSION}.")
    try:
        params = load_file(str(path / PARAMS_FILE))
        server_state = unflatten_state(load_file(str(path / SERVER_FILE)))
    except (OSError, SafetensorError) as error:
        raise CheckpointError(f"Checkpoint {path} is incomplete or corrupt: {error}.") from None
    if not (path / CLIENTS_DIR).is_dir():
        raise CheckpointError(f"Checkpoint {path} is incomplete: {CLIENTS_DIR}/ is missing.")
    return Checkpoint(path=path, round=int(meta["round"]), params=params, server_state=server_state, meta=meta)


def resolve_checkpoint(spec: str | bool, root: str | os.PathLike) -> Path:
    """A path, or ``"latest"``/``True`` for the newest checkpoint under ``root``."""
    if spec is True or str(spec).lower() in ("latest", "true"):
        recover_interrupted(root)
        found = list_checkpoints(root)
        if not found:
            raise CheckpointError(f"resume_from_checkpoint: no round-<k> checkpoint under {root}.")
        return found[-1]
    return Path(spec)


# --- a run's checkpoints ------------------------------------------------------------------------------------
#: settings that must match for a checkpoint to be resumed (besides a strategy's own, e.g. the topology)
FINGERPRINT_FIELDS = (
    "fed_algorithm", "perturbation", "corrections", "aggregator", "num_clients", "seed", "partition_scheme",
    "dirichlet_alpha", "classes_per_client", "min_partition_size", "effective_partition_seed",
)


def fingerprint_fields(args) -> tuple[str, ...]:
    """The names of the settings a checkpoint records and a resume must match: the run's set-up and every
    hyperparameter the run's pieces declare (read from the piece registry through ``args``)."""
    return FINGERPRINT_FIELDS + tuple(name for name in args.algorithm_hyperparameters() if name not in FINGERPRINT_FIELDS)


@dataclass
class Restored:
    """What a run resumes from: the global weights ``{"params"[, "buffers"]}``, the server state, the
    number of completed rounds, the history so far and the wall time spent before."""

    weights: dict[str, torch.Tensor]
    server_state: dict[str, dict[str, torch.Tensor]]
    round: int
    history: list[dict]
    wall_seconds: float


class RunCheckpoints:
    """Saves and restores the checkpoints of one run under ``<output_dir>/checkpoints``.

    Args:
        args: the run's arguments (output_dir, save_total_limit and the fingerprinted settings).
        space, buffer_space: the model's trainable parameters (and averaged buffers, or None) by name.
        extra_fingerprint: further values a resume must match (parameter count, LoRA base digest, the
            strategy's settings).
    """

    def __init__(self, args, space, buffer_space=None, extra_fingerprint: dict | None = None):
        self.root = os.path.join(args.output_dir, "checkpoints")
        self.save_total_limit = args.save_total_limit
        self.space, self.buffer_space = space, buffer_space
        self.fingerprint = {name: getattr(args, name) for name in fingerprint_fields(args)}
        self.fingerprint.update(extra_fingerprint or {})

    def save(self, round_number: int, weights: dict[str, torch.Tensor], server_state, store: ClientStateStore,
             history: list[dict], wall_seconds: float) -> Path:
        meta = {"fingerprint": self.fingerprint, "history": history, "wall_seconds": wall_seconds}
        tensors = self.space.named_tensors(weights["params"])
        if weights.get("buffers") is not None:
            tensors.update(self.buffer_space.named_tensors(weights["buffers"]))
        return save_checkpoint(self.root, round_number, tensors, server_state, store, meta, self.save_total_limit)

    def restore(self, spec: str | bool, store: ClientStateStore, dtype: torch.dtype) -> Restored:
        """Check the checkpoint against this run, load the client states into ``store``, return the rest."""
        path = resolve_checkpoint(spec, self.root)
        checkpoint = load_checkpoint(path)
        saved = checkpoint.meta.get("fingerprint", {})
        for name, value in self.fingerprint.items():
            if name in saved and saved[name] != value:
                raise CheckpointError(
                    f"{name}: the checkpoint {path} was made with {name}={saved[name]!r}, this run has {value!r}; "
                    "resume with the original settings or start a new output_dir."
                )
        names, shapes = list(self.space.names), list(self.space.shapes)
        if self.buffer_space is not None:
            names, shapes = names + self.buffer_space.names, shapes + self.buffer_space.shapes
        if set(checkpoint.params) != set(names) or any(checkpoint.params[n].shape != s for n, s in zip(names, shapes)):
            raise CheckpointError(f"Checkpoint {path} holds different parameters than this model.")
        weights = {"params": torch.cat([checkpoint.params[n].reshape(-1) for n in self.space.names]).to(dtype)}
        if self.buffer_space is not None:
            weights["buffers"] = torch.cat([checkpoint.params[n].reshape(-1).float() for n in self.buffer_space.names])
        store.import_from(checkpoint.client_states_dir)
        logger.info("Resuming from %s (round %d)", path, checkpoint.round)
        return Restored(weights=weights, server_state=checkpoint.server_state, round=checkpoint.round,
                        history=list(checkpoint.meta.get("history", [])),
                        wall_seconds=float(checkpoint.meta.get("wall_seconds", 0.0)))
