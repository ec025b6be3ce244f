"""Atomic file writes: a kill mid-write leaves the previous file intact."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file


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


def _atomic_write(path: str | os.PathLike, write, durable: bool = True) -> None:
    """Write to a temporary file in the same folder and rename it over ``path``.

    ``durable``: also fsync the file and the folder, so the new contents survive a power loss; without
    it the rename still makes a killed process leave either the old or the new file, never a mix.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        if durable:
            with open(tmp, "rb") as handle:
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(path.parent)


def atomic_save_safetensors(tensors: dict[str, torch.Tensor], path: str | os.PathLike, metadata=None) -> None:
    _atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=metadata))


def atomic_write_json(obj, path: str | os.PathLike) -> None:
    def write(tmp):
        with open(tmp, "w") as handle:
            json.dump(obj, handle, indent=2, default=str)

    _atomic_write(path, write)


class RecordLog:
    """A per-round log: a JSON list with one record per line, rewritten atomically, each record encoded once.

    One record per line is as readable as indented JSON, and json's C encoder writes it (indentation forces
    the pure-Python one: ~10x slower on long runs). Rewriting the whole list every round also re-encoded
    every earlier record: O(rounds) JSON encodes per round for a file that changes by one line.
    ``write(records)`` encodes only the records appended since the last call on the same list (records are
    final once appended: a change to an earlier one is not seen) and rewrites the file from the encoded lines.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = path
        self._source: list | None = None
        self._lines: list[str] = []

    def write(self, records: list, durable: bool = False) -> None:
        if records is not self._source or len(records) < len(self._lines):  # a new list (a resume): start over
            self._source, self._lines = records, []
        self._lines.extend(_encode_record(r) for r in records[len(self._lines):])
        _write_lines(self._lines, self.path, durable)


def _encode_record(record) -> str:
    return json.dumps(record, default=str)


def _write_lines(lines: list[str], path: str | os.PathLike, durable: bool) -> None:
    def write(tmp):
        with open(tmp, "w") as handle:
            handle.write("[\n" + ",\n".join(lines) + "\n]\n")

    _atomic_write(path, write, durable)
