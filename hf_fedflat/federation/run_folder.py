"""One run, one folder: the lock a run holds on its ``output_dir``, its run id, and what it finds there.

A run *claims* its folder before it writes anything (the CLI before any data or model loads, ``train()`` in any
case), on the main process only; the other processes of a multi-process run receive the outcome:

1. **The lock.** ``fcntl.flock`` on :data:`LOCK_FILE` in ``output_dir``, held until the run ends and released by
   the operating system when the process dies (a ``SIGKILL`` included). The file records the holder: pid, host,
   start time and run id. A second run into a held folder is refused (:class:`RunFolderError`, naming the
   holder) at once, whatever it was asked to do.
2. **Entries of the wrong kind.** A file where the run keeps a folder (``checkpoints``, ``final_model``,
   ``client_state_dir``) or a folder where it writes a file (``run.lock``, ``run_status.json``, ``history.json``)
   is refused naming it, before anything is written (found at the first save, it would lose the rounds before).
   A resume from another folder's checkpoint into a folder holding checkpoints of another run is refused (the run
   ids are read from the checkpoints, so a folder without ``run_status.json`` is checked too).
3. **Another run's files.** A folder holding a run's checkpoints, final model, history or status
   (:data:`RUN_OUTPUTS`) is refused unless the new run resumes it (``resume_from_checkpoint``) or replaces it
   (``overwrite_output_dir``: the old run's outputs, :data:`RUN_ENTRIES` minus the inputs kept, are deleted
   before the new run writes; files that are not a run's stay).
4. **The run id.** A new run draws one; a resumed run keeps the folder's (recorded in ``run_status.json``). It is
   written into the lock file, ``run_status.json``, every checkpoint and ``final_model/federated_config.json``; a
   resume refuses a checkpoint of another run (:mod:`.checkpoint`).
5. **The status.** ``run_status.json`` says ``running`` from the moment the lock is held
   (:func:`~.outcome.write_run_status` writes the end: ``completed``, ``failed`` or ``interrupted``). A run
   refused before its first round (bad input) puts the folder's previous status back, so that a refusal leaves
   the folder as it found it.

Within one process the claim is re-entrant (``hf-fedflat train`` claims in ``build_experiment``, ``train()`` again):
both return the same :class:`RunFolder`, released when ``train()`` ends.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import logging
import os
import shutil
import socket
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..io import atomic_write_json, check_write_path, refuse_symlinks_in, restore_interrupted_dir

__all__ = ["FOLDER_ENTRIES", "LOCK_FILE", "RUN_OUTPUTS", "RunFolder", "RunFolderError", "abandon_run_folder",
           "adopt_run_id", "check_entry_kinds", "check_foreign_resume", "claim_run_folder", "claimed_run_folder", "describe_run_outputs", "held_run_folder", "holds_run_folder",
           "process_alive", "read_holder", "release_run_folder"]

logger = logging.getLogger(__name__)

#: the lock file in ``output_dir`` (its contents: the holder's pid, host, start time and run id)
LOCK_FILE = "run.lock"
#: what makes a folder hold a run: any of these (``checkpoints/`` with a ``round-<k>`` or a leftover in it)
RUN_OUTPUTS = ("run_status.json", "history.json", "final_model", "checkpoints")
#: what ``overwrite_output_dir`` deletes: a run's outputs and its temporary leftovers (dot-names that start with
#: one of these); the folder's other files (the user's, a sweep's ``sweep_member.json``, the smoke inputs
#: ``smoke_data/`` and ``smoke_assets/``) stay
OVERWRITTEN = ("run_status.json", "history.json", "final_model", "checkpoints", "partition.json",
               "partition_heatmap.png", "data_validation.json", "client_states", "client_states_gossip_staging",
               "runs", "trainer_state.json", "all_results.json", "train_results.json", "eval_results.json",
               "predict_results.json", "predictions.json")
_HIDDEN_LEFTOVERS = (".final_model.", ".history.json.", ".run_status.json.", ".partition.json.",
                     ".partition_heatmap.png.", ".data_validation.json.", ".hub-staging-", ".eval_results.json.",
                     ".predict_results.json.", ".predictions.json.")


class RunFolderError(ValueError):
    """The run's ``output_dir`` is held by another live run, or holds another run's files (the message names
    them and the ways out). Raised before the run writes anything; ``hf-fedflat train`` exits with status 2."""


@dataclass
class RunFolder:
    """A claimed ``output_dir``: ``run_id``, the lock's file descriptor (main process; -1 elsewhere), and the
    ``run_status.json`` found there before the claim (put back if the run is refused before its first round)."""

    output_dir: str
    run_id: str
    resumed: bool
    started: str
    fd: int = -1
    previous_status: bytes | None = None
    #: set once the run's first round is about to start: from then on an exit is recorded, never undone
    rounds_started: bool = False
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def is_holder(self) -> bool:
        return self.fd >= 0

    def status_fields(self) -> dict[str, Any]:
        """What ``run_status.json`` records about the run besides its outcome."""
        return {"run_id": self.run_id, "pid": os.getpid(), "host": socket.gethostname(), "started": self.started}


#: the folders this process holds, by real path
_HELD: dict[str, RunFolder] = {}


def _key(output_dir: str | os.PathLike) -> str:
    return os.path.realpath(os.path.abspath(os.fspath(output_dir)))


def holds_run_folder(output_dir: str | os.PathLike) -> bool:
    """Whether this process holds the lock of ``output_dir`` (leftovers there may then be removed)."""
    folder = _HELD.get(_key(output_dir))
    return folder is not None and folder.is_holder


def held_run_folder(output_dir: str | os.PathLike) -> RunFolder | None:
    """The :class:`RunFolder` this process holds for ``output_dir``, or None."""
    return _HELD.get(_key(output_dir))


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine (one of another user counts as alive)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_holder(output_dir: str | os.PathLike) -> dict[str, Any]:
    """What the lock file of ``output_dir`` records (``{}`` when absent or unreadable)."""
    try:
        with open(os.path.join(output_dir, LOCK_FILE), encoding="utf-8") as handle:
            value = json.loads(handle.read() or "{}")
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _describe_holder(holder: dict[str, Any]) -> str:
    if not holder:
        return "a process that has not yet recorded itself"
    return (f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}, started {holder.get('started', '?')}, "
            f"run {holder.get('run_id', '?')}")


def describe_run_outputs(output_dir: str | os.PathLike) -> list[str]:
    """The run outputs (:data:`RUN_OUTPUTS`) in ``output_dir``, each described in a few words; ``[]`` when none."""
    root = Path(output_dir)
    found = []
    status_path = root / "run_status.json"
    if status_path.is_file() or status_path.is_symlink():
        try:
            status = json.loads(status_path.read_text())
            detail = f"status {status.get('status')!r}" + (f", run {status['run_id']}" if status.get("run_id") else "")
        except (OSError, ValueError, AttributeError):
            detail = "unreadable"
        found.append(f"run_status.json ({detail})")
    checkpoints = root / "checkpoints"
    if checkpoints.is_dir():
        rounds = sorted((int(n.split("-", 1)[1]) for n in os.listdir(checkpoints)
                         if n.startswith("round-") and n.split("-", 1)[1].isdigit()))
        if rounds:
            found.append(f"checkpoints/round-{rounds[0]}..round-{rounds[-1]}" if len(rounds) > 1
                         else f"checkpoints/round-{rounds[0]}")
        elif any(n.startswith(".") for n in os.listdir(checkpoints)):
            found.append("checkpoints/ (an interrupted save)")
    if (root / "final_model").exists() or (root / "final_model").is_symlink():
        found.append("final_model/")
    if (root / "history.json").exists() or (root / "history.json").is_symlink():
        found.append("history.json")
    return found


def _resumes_inside(resume, output_dir: str) -> bool:
    """Whether ``resume`` names a checkpoint of ``output_dir`` itself (``latest``/``True``, or a path under it)."""
    if resume is True or str(resume).lower() in ("latest", "true"):
        return True
    return (_key(resume) + os.sep).startswith(_key(output_dir) + os.sep)


def _remove_outputs(root: Path) -> list[str]:
    """Delete the run outputs of ``root`` (:data:`OVERWRITTEN` and hidden leftovers of them); returns the names."""
    removed = []
    for name in sorted(os.listdir(root)):
        if name in OVERWRITTEN or name.startswith(_HIDDEN_LEFTOVERS):
            path = root / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
            removed.append(name)
    return removed


#: the run's entries of ``output_dir`` that are folders; the others (:data:`~.reporting.RUN_ENTRIES`) are files
FOLDER_ENTRIES = ("final_model", "checkpoints", "client_states", "client_states_gossip_staging", "runs", "smoke_data",
                  "smoke_assets")


def check_entry_kinds(args) -> None:
    """Refuse, before the run writes anything, an entry of ``output_dir`` of the wrong kind: a file where the run
    keeps a folder (``checkpoints``, ``final_model``, ``client_state_dir``), a folder where it writes a file
    (``run.lock``, ``run_status.json``, ``history.json``, ...), or an ``output_dir`` that is a file. Found only at
    the first save, such an entry would lose the rounds trained before it."""
    from .reporting import RUN_ENTRIES

    root = Path(os.path.abspath(os.fspath(args.output_dir)))
    if root.exists() and not root.is_dir():
        raise RunFolderError(f"output_dir: {root} exists and is not a folder; pass a folder (it is created if "
                             "missing).")
    for parent in root.parents:
        if parent.exists():
            if not parent.is_dir():
                raise RunFolderError(f"output_dir: {parent}, above {root}, is a file; name a folder path.")
            break
    state_dir = getattr(args, "client_state_dir", None)
    folders = [root / name for name in FOLDER_ENTRIES]
    if state_dir:
        state_dir = Path(os.path.abspath(state_dir))
        if state_dir.exists() and not state_dir.is_dir():
            raise RunFolderError(f"client_state_dir: {state_dir} is a file; name a folder (new or existing) for the "
                                 "clients' states.")
        folders += [state_dir.with_name(state_dir.name + "_gossip_staging")]
    for path in folders:
        if path.exists() and not path.is_dir():
            raise RunFolderError(f"output_dir: {path} is a file where the run keeps its {path.name}/ folder; move "
                                 "or delete it (or choose another output_dir).")
    for name in RUN_ENTRIES:
        path = root / name
        if name not in FOLDER_ENTRIES and path.is_dir() and not path.is_symlink():
            raise RunFolderError(f"output_dir: {path} is a folder where the run writes its {name} file; move or "
                                 "delete it (or choose another output_dir).")


def _checkpoint_run_id(path: Path) -> str | None:
    """The run id a checkpoint folder records (None when it records none or cannot be read: its resume says why)."""
    try:
        value = json.loads((path / "federated_state.json").read_text()).get("run_id")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) and value else None


def check_foreign_resume(output_dir: str | os.PathLike, resume) -> None:
    """A resume from another folder's checkpoint into ``output_dir`` that holds checkpoints of a different run is
    refused (it would overwrite them and leave two runs' files in one folder); the run ids come from the
    checkpoints themselves, so a folder without ``run_status.json`` is checked too."""
    if not resume or _resumes_inside(resume, os.fspath(output_dir)):
        return
    try:  # a run id recorded in run_status.json: the resume's own run-id check refuses another run's checkpoint
        if json.loads((Path(output_dir) / "run_status.json").read_text()).get("run_id"):
            return
    except (OSError, ValueError, AttributeError):
        pass
    source = _checkpoint_run_id(Path(os.fspath(resume)))
    if source is None:
        return
    own = Path(output_dir) / "checkpoints"
    if not own.is_dir():
        return
    for name in sorted(os.listdir(own)):
        found = _checkpoint_run_id(own / name) if name.startswith("round-") else None
        if found is not None and found != source:
            raise RunFolderError(
                f"resume_from_checkpoint: {resume} belongs to run {source}, but {output_dir} holds checkpoints of "
                f"run {found} ({name}); resume into an empty output_dir (or that run's own folder), or resume "
                f"{output_dir}'s own run with --resume_from_checkpoint latest.")


def _new_run_id() -> str:
    return uuid.uuid4().hex[:16]


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _lock(root: Path) -> int:
    """Open and lock ``root/LOCK_FILE``; the descriptor (:class:`RunFolderError` when another process holds it)."""
    path = check_write_path(root / LOCK_FILE, root)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        os.close(fd)
        if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise
        raise RunFolderError(
            f"output_dir: {root} is in use by another run ({_describe_holder(read_holder(root))}); wait for it to "
            "end, or choose another output_dir.") from None
    return fd


def _write_holder(fd: int, record: dict[str, Any]) -> None:
    data = (json.dumps(record) + "\n").encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    os.fsync(fd)


def _claim(args, resume) -> RunFolder:
    """Main process: lock ``args.output_dir``, check what it holds, write ``run_status.json`` (``running``)."""
    from .reporting import run_entries

    output_dir = os.path.abspath(os.fspath(args.output_dir))
    root = Path(output_dir)
    # a planted link: refused (UnsafeWritePathError) before anything; inside a checkpoint, by the resume that reads
    # it (CorruptCheckpointError, naming the file), and by the run's own check at its start
    refuse_symlinks_in(root, [entry for entry in run_entries(args) if entry != "checkpoints"])
    check_write_path(root / "checkpoints", root)
    check_entry_kinds(args)
    check_foreign_resume(output_dir, resume)
    root.mkdir(parents=True, exist_ok=True)
    fd = _lock(root)
    try:
        restore_interrupted_dir(root / "final_model")  # a final save killed between its two renames
        overwrite = bool(getattr(args, "overwrite_output_dir", False))
        found = describe_run_outputs(root)
        if overwrite and resume and _resumes_inside(resume, output_dir):
            raise RunFolderError(
                f"overwrite_output_dir: it would delete the checkpoints that resume_from_checkpoint={resume!r} "
                f"resumes in {output_dir}; give one of the two.")
        previous_status = None
        status_path = root / "run_status.json"
        if found and not resume:
            if not overwrite:
                raise RunFolderError(
                    f"output_dir: {output_dir} holds another run's files ({', '.join(found)}); pass "
                    "--overwrite_output_dir true to delete them and start a new run there, or --resume_from_checkpoint "
                    "latest to continue that run (or choose another output_dir).")
            removed = _remove_outputs(root)
            logger.warning("overwrite_output_dir: deleted the previous run's %s in %s.", ", ".join(removed), output_dir)
        elif status_path.is_file() and not status_path.is_symlink():
            previous_status = status_path.read_bytes()
        run_id = None
        if resume and previous_status is not None:
            try:
                run_id = json.loads(previous_status).get("run_id")
            except (ValueError, AttributeError):
                run_id = None
        folder = RunFolder(output_dir=output_dir, run_id=run_id or _new_run_id(), resumed=bool(resume),
                           started=_now(), fd=fd, previous_status=previous_status)
        folder.info["run_id_from_folder"] = run_id is not None
        _write_holder(fd, {"pid": os.getpid(), "host": socket.gethostname(), "started": folder.started,
                           "run_id": folder.run_id})
        write_running_status(folder)
    except BaseException:
        os.close(fd)
        raise
    return folder


def write_running_status(folder: RunFolder) -> None:
    """``run_status.json`` = ``running`` (with the run id, pid, host and start time)."""
    atomic_write_json({"status": "running", "reason": None, **folder.status_fields()},
                      os.path.join(folder.output_dir, "run_status.json"), root=folder.output_dir)


def claim_run_folder(args, resume=None, comm=None) -> RunFolder:
    """Claim ``args.output_dir`` for this run (see the module docstring); every process of the run calls it.

    Args:
        args: the run's arguments (``output_dir``, ``overwrite_output_dir``).
        resume: the run's ``resume_from_checkpoint`` (a folder holding a run is accepted when given).
        comm: the run's process group (default: this process's); the main process claims, the others receive
            the run id, or the same :class:`RunFolderError`.

    Returns:
        The :class:`RunFolder` (the same object when this process already holds the folder).
    """
    if comm is None:
        from .comm import get_process_group

        comm = get_process_group()
    folder, outcome = None, None
    if comm.is_main:
        folder = _HELD.get(_key(args.output_dir))
        if folder is None:
            try:
                folder = _claim(args, resume)
            except Exception as refused:  # the other processes stop with the same message
                if not comm.distributed:
                    raise
                outcome = ("refused", str(refused))
                comm.broadcast_object(outcome)
                raise
            else:
                _HELD[_key(args.output_dir)] = folder
        if outcome is None:
            outcome = ("claimed", folder.run_id, folder.started, folder.resumed)
    outcome = comm.broadcast_object(outcome)
    if outcome[0] == "refused":
        raise RunFolderError(outcome[1])
    if folder is None:  # another process of the run: the main one holds the lock
        folder = _HELD.get(_key(args.output_dir))
        if folder is None:
            folder = RunFolder(output_dir=os.path.abspath(os.fspath(args.output_dir)), run_id=outcome[1],
                               started=outcome[2], resumed=outcome[3])
            _HELD[_key(args.output_dir)] = folder
    return folder


@contextlib.contextmanager
def claimed_run_folder(args, resume=None, comm=None):
    """Claim ``args.output_dir`` (:func:`claim_run_folder`) for the code inside: loading data, building the trainer,
    ``train()`` (which re-enters the claim and records how the run ended). An error before the first round puts the
    folder's status back (:func:`abandon_run_folder`); the lock is released at the end."""
    folder = claim_run_folder(args, resume, comm)
    try:
        yield folder
    except BaseException:
        abandon_run_folder(folder)
        raise
    finally:
        release_run_folder(folder)


def adopt_run_id(folder: RunFolder, run_id: str) -> None:
    """A resume into a folder without a recorded run id continues the checkpoint's run: its id becomes this
    run's (lock file and ``run_status.json`` rewritten)."""
    folder.run_id = run_id
    if folder.is_holder:
        _write_holder(folder.fd, {"pid": os.getpid(), "host": socket.gethostname(), "started": folder.started,
                                  "run_id": run_id})
        write_running_status(folder)


def abandon_run_folder(folder: RunFolder) -> None:
    """The run was refused before its first round: put the folder's previous ``run_status.json`` back (remove the
    one this run wrote when there was none)."""
    if not folder.is_holder or folder.rounds_started:
        return
    path = os.path.join(folder.output_dir, "run_status.json")
    try:
        if folder.previous_status is None:
            if os.path.isfile(path) and not os.path.islink(path):
                os.unlink(path)
        else:
            from ..io import atomic_write_text

            atomic_write_text(folder.previous_status.decode(), path, root=folder.output_dir)
    except OSError as error:  # the refusal itself is what the user needs to see
        logger.warning("Could not restore %s after the refusal: %s", path, error)


def release_run_folder(folder: RunFolder | None) -> None:
    """Release the lock (the lock file stays: removing it could let two runs lock two different files)."""
    if folder is None:
        return
    if _HELD.get(_key(folder.output_dir)) is folder:
        del _HELD[_key(folder.output_dir)]
    if folder.fd >= 0:
        try:
            os.close(folder.fd)
        finally:
            folder.fd = -1
