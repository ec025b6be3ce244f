"""How a command-line run ends: bad input is one line naming the field or file and exit status 2 (as argparse
does for a bad flag), a run that trained nothing exits 3, a run stopped by a full disk (or a quota, a file-size
limit) is one line naming the file, the last complete checkpoint and how to resume, exit status 4; anything else
keeps its traceback (a bug)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["EXIT_BAD_INPUT", "EXIT_DISK_FULL", "input_error_types", "report_disk_full", "report_input_error",
           "run_command_line"]

EXIT_BAD_INPUT = 2
EXIT_DISK_FULL = 4


def input_error_types() -> tuple[type[Exception], ...]:
    """Errors about the user's settings, files, data or Hub access; each message names the field, file or repo."""
    from ..data.images import DatasetUnavailableError
    from ..data.input_checks import InvalidInputError
    from ..data.leaf import LeafFormatError
    from ..federation.checkpoint import CheckpointError
    from ..federation.run_folder import RunFolderError
    from ..hub.push import HubAccessError
    from ..io import IncompleteSaveError, UnsafeWritePathError
    from .parsing import ConfigError

    return (ConfigError, CheckpointError, InvalidInputError, UnsafeWritePathError, IncompleteSaveError,
            HubAccessError, DatasetUnavailableError, RunFolderError, LeafFormatError)


def report_input_error(prog: str, error: BaseException) -> int:
    print(f"{prog}: error: {error}", file=sys.stderr)
    return EXIT_BAD_INPUT


def report_disk_full(prog: str, error: BaseException) -> int | None:
    """A write that ran out of room: one line naming the file (and, from a run, the checkpoint to resume), and
    :data:`EXIT_DISK_FULL`; None for any other error."""
    from ..io import disk_full_error, is_disk_full

    if not is_disk_full(error):
        return None
    full = disk_full_error(error, getattr(error, "filename", None) or "a file")
    print(f"{prog}: error: {full}", file=sys.stderr)
    return EXIT_DISK_FULL


def run_command_line(main: Callable[[], Any], prog: str | None = None) -> None:
    """Run a script's ``main()`` and exit with its status (0, or 2 / 3 above); for ``if __name__ == "__main__"``."""
    from ..federation.outcome import EXIT_TRAINING_FAILED, TrainingFailedError

    prog = prog or os.path.basename(sys.argv[0] or "hf-fedflat")
    try:
        main()
    except TrainingFailedError as failed:
        print(f"{prog}: training failed: {failed.reason}", file=sys.stderr)
        sys.exit(EXIT_TRAINING_FAILED)
    except input_error_types() as error:
        sys.exit(report_input_error(prog, error))
    except Exception as error:
        status = report_disk_full(prog, error)
        if status is None:
            raise
        sys.exit(status)
    sys.exit(0)
