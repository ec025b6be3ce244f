"""Atomic file writes that never follow a symbolic link.

Every file a run writes into its ``output_dir`` goes through here: a temporary file in the same folder,
renamed over the target, so a kill mid-write leaves the previous file intact. A symbolic link at the
target, or a symlinked folder between the run's folder (``root``) and the target, is refused with an
:class:`UnsafeWritePathError` naming the path: a link planted in ``output_dir`` (``partition.json ->
/etc/...``, ``final_model -> /elsewhere``) must not make the run write outside it. (``os.replace`` itself
swaps a link at the destination rather than following it; a symlinked parent folder it would follow.)
``output_dir`` itself, and the folders above it, may be links: the check starts below ``root``.

Whole folders (``final_model/``) are written by :func:`atomic_write_dir`: into a fresh temporary folder
beside the target, closed with a completion marker (:data:`COMPLETE_MARKER`: every file's size and
SHA-256), then renamed into place; a kill or a full disk while saving leaves no folder that looks complete.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

__all__ = [
    "COMPLETE_MARKER",
    "DiskFullError",
    "IncompleteSaveError",
    "RecordLog",
    "UnsafeWritePathError",
    "atomic_save_safetensors",
    "atomic_savefig",
    "atomic_write_dir",
    "atomic_write_json",
    "is_disk_full",
    "atomic_write_text",
    "check_write_path",
    "fsync_dir",
    "refuse_symlinks_in",
    "verify_complete_dir",
]

logger = logging.getLogger(__name__)

#: the completion marker :func:`atomic_write_dir` writes last into a folder (not uploaded to the Hub)
COMPLETE_MARKER = "hf_fedflat_complete.json"


class UnsafeWritePathError(ValueError):
    """A write would go through a symbolic link (the target itself, or a folder below the run's folder)."""


class IncompleteSaveError(ValueError):
    """A folder written by :func:`atomic_write_dir` lacks its completion marker or does not match it."""


def fsync_dir(path: str | os.PathLike) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _link_error(path: Path, what: str) -> UnsafeWritePathError:
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    return UnsafeWritePathError(
        f"{path}: {what} is a symbolic link (to {target}); hf_fedflat does not write through symbolic links in "
        "the run's folder (output_dir), so that a planted link cannot make it overwrite a file elsewhere. Remove "
        "the link (or choose another output_dir) and run again."
    )


def check_write_path(path: str | os.PathLike, root: str | os.PathLike | None = None) -> Path:
    """Refuse ``path`` when it is a symbolic link, or when a folder between ``root`` and it is one.

    Args:
        path: the file (or folder) about to be written.
        root: the run's folder (``output_dir``); folders from below it down to ``path``'s parent are checked.
            ``None`` (or a ``path`` outside ``root``): only ``path`` itself is checked.

    Returns:
        ``path`` as an absolute ``Path`` (not resolved: links above ``root`` are the user's choice).

    Raises:
        UnsafeWritePathError: naming the link.
    """
    path = Path(os.path.abspath(path))
    if path.is_symlink():
        raise _link_error(path, "the file to write")
    if root is not None:
        root = Path(os.path.abspath(root))
        try:
            relative = path.parent.relative_to(root)
        except ValueError:
            return path
        current = root
        for part in relative.parts:
            current = current / part
            if current.is_symlink():
                raise _link_error(current, f"a folder on the way to {path.name}")
    return path


def refuse_symlinks_in(root: str | os.PathLike, names: tuple[str, ...] | list[str]) -> None:
    """Refuse a symbolic link at ``root/<name>`` or anywhere inside those of the names that are folders.

    The run's own entries of ``output_dir`` (``history.json``, ``final_model/``, ``checkpoints/``, ...) are checked
    before the run writes anything (the folder's other contents are the user's). Raises
    :class:`UnsafeWritePathError` naming the first link found.
    """
    root = Path(os.path.abspath(root))
    for name in names:
        entry = Path(name) if os.path.isabs(name) else root / name
        check_write_path(entry, root)
        if entry.is_dir():
            for dirpath, dirnames, filenames in os.walk(entry):  # os.walk does not descend into linked folders
                for child in (*dirnames, *filenames):
                    if os.path.islink(os.path.join(dirpath, child)):
                        raise _link_error(Path(dirpath) / child, "an entry of the run's folder")


#: a write that ran out of room: no space left, a quota, a file-size limit (RLIMIT_FSIZE: EFBIG)
_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
#: how safetensors' Rust writer words the same (its errors are not OSErrors)
_DISK_FULL_WORDS = ("No space left on device", "StorageFull", "Disk quota exceeded", "File too large",
                    "FileTooLarge")


class DiskFullError(OSError):
    """A write ran out of room (no space left on the device, a quota, a file-size limit): ``path`` is the file
    being written; ``advice`` (added by the run) names the last complete checkpoint and how to resume."""

    def __init__(self, path: str | os.PathLike, reason: str, advice: str | None = None):
        super().__init__(errno.ENOSPC, reason, os.fspath(path))
        self.path, self.reason, self.advice = os.fspath(path), reason, advice

    def __str__(self) -> str:
        return f"{self.path}: no room left to write it ({self.reason})" + (f"; {self.advice}" if self.advice else ".")


def is_disk_full(error: BaseException) -> bool:
    """Whether ``error`` (an ``OSError``, or safetensors' ``SafetensorError``) is a write that ran out of room."""
    if isinstance(error, DiskFullError):
        return True
    if isinstance(error, OSError):
        return error.errno in _DISK_FULL_ERRNOS
    return type(error).__name__ == "SafetensorError" and any(word in str(error) for word in _DISK_FULL_WORDS)


def disk_full_error(error: BaseException, path: str | os.PathLike) -> DiskFullError | None:
    """``error`` as a :class:`DiskFullError` naming ``path`` (or the file the ``OSError`` names), or None when
    it is not one."""
    if isinstance(error, DiskFullError) or not is_disk_full(error):
        return error if isinstance(error, DiskFullError) else None
    if isinstance(error, OSError):
        reason = error.strerror or str(error)
    else:
        reason = next(word for word in _DISK_FULL_WORDS if word in str(error))
    return DiskFullError(path, reason)


def _atomic_write(path: str | os.PathLike, write: Callable[[str], Any], durable: bool = True,
                  root: str | os.PathLike | None = None) -> None:
    """Write to a temporary file in the same folder and rename it over ``path`` (see :func:`check_write_path`).

    ``durable``: also fsync the file and the folder, so the new contents survive a power loss; without
    it the rename still makes a killed process leave either the old or the new file, never a mix.
    """
    path = check_write_path(path, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    # mkstemp opens with O_CREAT | O_EXCL: it never opens an existing file or follows a link
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        if durable:
            with open(tmp, "rb") as handle:
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as error:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        full = disk_full_error(error, path)
        if full is not None and full is not error:
            raise full from error
        raise
    if durable:
        fsync_dir(path.parent)


def atomic_save_safetensors(tensors: dict, path: str | os.PathLike, metadata=None, *,
                            root: str | os.PathLike | None = None) -> None:
    from safetensors.torch import save_file

    _atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=metadata), root=root)


def atomic_write_json(obj, path: str | os.PathLike, *, root: str | os.PathLike | None = None, indent: int | None = 2,
                      durable: bool = True) -> None:
    def write(tmp):
        with open(tmp, "w") as handle:
            json.dump(obj, handle, indent=indent, default=str)

    _atomic_write(path, write, durable, root=root)


def atomic_write_text(text: str, path: str | os.PathLike, *, root: str | os.PathLike | None = None,
                      durable: bool = True, newline: str | None = None) -> None:
    def write(tmp):
        with open(tmp, "w", encoding="utf-8", newline=newline) as handle:
            handle.write(text)

    _atomic_write(path, write, durable, root=root)


def atomic_savefig(fig, path: str | os.PathLike, *, root: str | os.PathLike | None = None, **savefig_kwargs) -> Path:
    """``fig.savefig`` through a temporary file (the format is given, as the temporary name has no ``.png``)."""
    savefig_kwargs.setdefault("format", "png")
    _atomic_write(path, lambda tmp: fig.savefig(tmp, **savefig_kwargs), durable=False, root=root)
    return Path(path)


# -------------------------------------------------------------------------------------------------
# whole folders
# -------------------------------------------------------------------------------------------------
def _sha256(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _manifest(folder: Path) -> dict[str, dict[str, Any]]:
    files = {}
    for dirpath, _, filenames in os.walk(folder):
        for name in sorted(filenames):
            full = Path(dirpath) / name
            if full.is_symlink():
                raise _link_error(full, "a file of the folder being saved")
            relative = full.relative_to(folder).as_posix()
            if relative != COMPLETE_MARKER:
                files[relative] = {"size": full.stat().st_size, "sha256": _sha256(full)}
    return dict(sorted(files.items()))


def _remove_tree(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path, ignore_errors=True)


def _owner_gone(suffix: str) -> bool:
    """Whether the process whose pid starts ``suffix`` (``<pid>-<random>``, a temporary folder's name after its
    prefix) is gone, or is this one (its earlier save is over: one save at a time); False when the name carries
    no pid (a folder of another writer is never removed)."""
    pid, dash, _ = suffix.partition("-")
    if not (dash and pid.isdigit()):
        return False
    if int(pid) == os.getpid():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):
        return False
    return False


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _exchange(first: Path, second: Path) -> bool:
    """Swap two existing paths in one step (Linux ``renameat2(RENAME_EXCHANGE)``): no moment where either is
    missing. False where the system or the file system cannot (the caller then renames twice)."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), os.fspath(second))


def restore_interrupted_dir(directory: str | os.PathLike) -> bool:
    """Put back a folder a save killed between its two renames left hidden (``.<name>.old-<pid>-*/<name>``, its
    writer gone) when ``directory`` itself is missing; True when it did. The next save, the next start of the run
    and :func:`~hf_fedflat.models.factory.load_model` call it."""
    directory = Path(os.path.abspath(directory))
    if os.path.lexists(directory) or not directory.parent.is_dir():
        return False
    prefix = f".{directory.name}.old-"
    for hidden in sorted(directory.parent.glob(prefix + "*")):
        previous = hidden / directory.name
        if _owner_gone(hidden.name[len(prefix):]) and previous.is_dir() and not previous.is_symlink():
            os.replace(previous, directory)
            _remove_tree(hidden)
            logger.warning("Restored %s: a save was interrupted while it replaced it.", directory)
            return True
    return False


def _newest_file(folder: Path) -> str | None:
    """The file under ``folder`` written last (None when there is none)."""
    newest = None
    for dirpath, _, filenames in os.walk(folder):
        for name in filenames:
            path = os.path.join(dirpath, name)
            stamp = os.stat(path).st_mtime_ns
            if newest is None or stamp >= newest[0]:
                newest = (stamp, path)
    return newest[1] if newest else None


def atomic_write_dir(directory: str | os.PathLike, fill: Callable[[str], Any], *,
                     root: str | os.PathLike | None = None, durable: bool = True) -> Path:
    """Write a whole folder: ``fill(tmp)`` writes the files into a fresh temporary folder beside ``directory``;
    then :data:`COMPLETE_MARKER` (size and SHA-256 of every file) is written last, and the folder is renamed
    into place. An existing ``directory`` is swapped with it in one step (``renameat2(RENAME_EXCHANGE)``) and
    deleted after; where the file system cannot swap, it is moved aside first, and a kill between the two renames
    leaves it hidden until :func:`restore_interrupted_dir` (the next save, the run's next start, ``load_model``)
    puts it back.

    A failure or a kill inside ``fill`` (a full disk, an exception) leaves ``directory`` as it was and no
    folder that looks complete (the temporary ``.<name>.tmp-<pid>-*`` folder of a killed save is removed by the
    next save, once process ``<pid>`` is gone: a live writer's folder is never touched). ``directory`` and the
    folders below ``root`` must not be symbolic links (:func:`check_write_path`).

    Returns:
        ``directory`` as an absolute ``Path``.
    """
    directory = check_write_path(directory, root)
    parent = directory.parent
    parent.mkdir(parents=True, exist_ok=True)
    restore_interrupted_dir(directory)  # (before the clean-up below: a hidden previous folder is the only one)
    for kind in ("tmp", "old"):  # left by a killed save: removed by this one once their owner is gone
        prefix = f".{directory.name}.{kind}-"
        for stale in parent.glob(prefix + "*"):
            if _owner_gone(stale.name[len(prefix):]):
                _remove_tree(stale)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.tmp-{os.getpid()}-", dir=parent))
    try:
        fill(os.fspath(tmp))
        manifest = {"complete": True, "written_by": "hf_fedflat", "files": _manifest(tmp)}
        with open(tmp / COMPLETE_MARKER, "x") as handle:
            json.dump(manifest, handle, indent=2)
        if durable:
            for dirpath, _, filenames in os.walk(tmp):
                for name in filenames:
                    with open(os.path.join(dirpath, name), "rb") as handle:
                        os.fsync(handle.fileno())
                fsync_dir(dirpath)
        check_write_path(directory, root)  # (again: the save may have taken long)
        old = None
        if os.path.lexists(directory) and _exchange(tmp, directory):  # one step: never a moment without a folder
            old, tmp = tmp, None
        elif os.path.lexists(directory):
            old = Path(tempfile.mkdtemp(prefix=f".{directory.name}.old-{os.getpid()}-", dir=parent))
            os.replace(directory, old / directory.name)
        if tmp is not None:
            try:
                os.replace(tmp, directory)
            except BaseException:
                if old is not None:  # put the previous folder back
                    os.replace(old / directory.name, directory)
                raise
    except BaseException as error:
        written = getattr(error, "filename", None)  # the file inside the temporary folder, as it will be named
        if tmp is not None and not isinstance(written, str) and is_disk_full(error):
            written = _newest_file(tmp)  # (safetensors' errors name no file: the one it was writing is the newest)
        if tmp is not None and isinstance(written, str) and written.startswith(os.fspath(tmp) + os.sep):
            written = os.fspath(directory) + written[len(os.fspath(tmp)):]
        if tmp is not None:
            _remove_tree(tmp)
        if is_disk_full(error):  # named as the file in ``directory``, not in the removed temporary folder
            reason = disk_full_error(error, directory).reason
            raise DiskFullError(written if isinstance(written, str) else directory, reason,
                                getattr(error, "advice", None)) from error
        raise
    if durable:
        fsync_dir(parent)
    if old is not None:
        _remove_tree(old)
    return directory


def verify_complete_dir(directory: str | os.PathLike) -> dict[str, Any]:
    """Check a folder written by :func:`atomic_write_dir` against its marker; returns the marker.

    Raises:
        IncompleteSaveError: naming the missing marker, or the first missing/changed file.
    """
    directory = Path(directory)
    marker = directory / COMPLETE_MARKER
    if not marker.is_file():
        raise IncompleteSaveError(
            f"{marker}: missing; {directory} was not completely written by hf_fedflat (an interrupted save, or a "
            "folder from elsewhere). Save the model again (trainer.save_model) before using it."
        )
    try:
        manifest = json.loads(marker.read_text())
        files = dict(manifest["files"])
    except (ValueError, KeyError, TypeError) as error:
        raise IncompleteSaveError(f"{marker}: unreadable completion marker ({error}).") from error
    for name, entry in files.items():
        path = directory / name
        if not path.is_file():
            raise IncompleteSaveError(f"{path}: listed in {COMPLETE_MARKER} but missing.")
        if path.stat().st_size != entry.get("size") or _sha256(path) != entry.get("sha256"):
            raise IncompleteSaveError(f"{path}: size or SHA-256 differs from {COMPLETE_MARKER} (changed or truncated).")
    return manifest


# -------------------------------------------------------------------------------------------------
# history.json
# -------------------------------------------------------------------------------------------------
class RecordLog:
    """A per-round log: a JSON list with one record per line, rewritten atomically, each record encoded once.

    One record per line is as readable as indented JSON, and json's C encoder writes it (indentation forces
    the pure-Python one: ~10x slower on long runs). Rewriting the whole list every round also re-encoded
    every earlier record: O(rounds) JSON encodes per round for a file that changes by one line.
    ``write(records)`` encodes only the records appended since the last call on the same list (records are
    final once appended: a change to an earlier one is not seen) and rewrites the file from the encoded lines.

    ``min_interval_seconds``: a ``write(..., force=False)`` within that time of the last write leaves the records
    pending (for the next write or :meth:`flush`). The rename that makes a rewrite atomic costs ~0.2-0.5 ms here,
    2% of a 30 ms round (workload 6, ``benchmarks/user_data.py``); rounds that short need no file that is newer than a second.
    """

    def __init__(self, path: str | os.PathLike, root: str | os.PathLike | None = None,
                 min_interval_seconds: float = 0.0):
        self.path = path
        self.root = root
        self.min_interval_seconds = min_interval_seconds
        self._source: list | None = None
        self._lines: list[str] = []
        self._written_at: float | None = None

    def write(self, records: list, durable: bool = False, force: bool = True) -> bool:
        """Rewrite the file with ``records``; with ``force=False``, only if ``min_interval_seconds`` have passed
        since the last write. Returns whether it wrote."""
        if records is not self._source or len(records) < len(self._lines):  # a new list (a resume): start over
            self._source, self._lines = records, []
        now = time.monotonic()
        if not force and self._written_at is not None and now - self._written_at < self.min_interval_seconds:
            return False
        self._lines.extend(_encode_record(r) for r in records[len(self._lines):])
        _write_lines(self._lines, self.path, durable, self.root)
        self._written_at = now
        return True

    def flush(self, durable: bool = False) -> None:
        """Write the records left pending by a throttled :meth:`write`, if any."""
        if self._source is not None and len(self._lines) < len(self._source):  # records appended since the last write
            self.write(self._source, durable)


def _encode_record(record) -> str:
    return json.dumps(record, default=str)


def _write_lines(lines: list[str], path: str | os.PathLike, durable: bool, root=None) -> None:
    atomic_write_text("[\n" + ",\n".join(lines) + "\n]\n", path, durable=durable, root=root)
