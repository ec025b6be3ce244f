"""How a command-line run ends: bad input is one line naming the field or file and exit status 2 (as argparse
does for a bad flag), a run that trained nothing exits 3, anything else keeps its traceback (a bug)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["EXIT_BAD_INPUT", "input_error_types", "report_input_error", "run_command_line"]

EXIT_BAD_INPUT = 2


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
    sys.exit(0)
