"""Exit when the launcher dies: a training process started by ``accelerate launch`` (or ``torchrun``) whose
launcher is killed would otherwise go on alone for every remaining round.

The check is the parent's process id: recorded when the run starts, compared between rounds (and between
clients). A changed parent means the launcher died and the process was adopted (by init or a subreaper):
the run stops with :class:`LauncherExited` (a ``SystemExit``, exit status 1). It costs one ``getppid``.

``HF_FEDFLAT_EXIT_WITH_PARENT``: ``auto`` (default) watches only a process started by a launcher (accelerate
or torchrun set ``ACCELERATE_DYNAMO_BACKEND`` / ``TORCHELASTIC_RUN_ID``), so that ``nohup hf-fedflat train
... &`` still outlives its shell; ``1`` always watches; ``0`` never does.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)

ENV = "HF_FEDFLAT_EXIT_WITH_PARENT"
#: set in the training processes by ``accelerate launch`` and by ``torchrun``
LAUNCHER_ENV = ("ACCELERATE_DYNAMO_BACKEND", "TORCHELASTIC_RUN_ID")


class LauncherExited(SystemExit):
    """The process that launched this one died: the run stops (exit status 1)."""


def watch_requested(environ=os.environ) -> bool:
    """Whether this process should exit with its parent (see the module docstring)."""
    value = environ.get(ENV, "auto").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    if value != "auto":
        from ..field_checks import ConfigError

        raise ConfigError(f"{ENV}: expected auto, 1 or 0 (or true/false, yes/no, on/off), got {value!r}; set one of "
                          "these, or unset it.")
    return any(name in environ for name in LAUNCHER_ENV)


class ParentWatch:
    """Remembers the parent process at construction; :meth:`check` stops the run once it has changed."""

    def __init__(self, enabled: bool | None = None):
        self.enabled = watch_requested() if enabled is None else enabled
        self.parent = os.getppid()

    def parent_died(self) -> bool:
        return self.enabled and os.getppid() != self.parent

    def check(self, where: str = "") -> None:
        """Stop the run (:class:`LauncherExited`) if the parent died."""
        if self.parent_died():
            self.stop(where)

    def stop(self, where: str = "") -> None:
        message = (f"hf_fedflat: the launcher (parent process {self.parent}) exited{where}; stopping this "
                   f"training process (set {ENV}=0 to keep it running without its launcher).")
        logger.error(message)
        raise LauncherExited(message)
