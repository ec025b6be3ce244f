"""The entry layer: the ``hf-fedflat`` command, the recipes' helper, sweeps and comparisons, read top-down.

From the bottom up (a module imports only those below it, and the library beneath):

- ``parsing``: the one loader of every entry point (flags > ``--config`` > ``--smoke`` > a recipe's defaults);
- ``exit_codes``: how a command-line run ends (bad input: 2, nothing trained: 3);
- ``summary``: :class:`RunSummary`, what one run's history says, read by every table below;
- ``experiment``: one run from its configuration (data, model, trainer);
- ``comparison`` (several algorithms on the same data), ``recipes`` (what the scripts in ``recipes/`` share),
  ``sweep`` (a grid of runs and its paper table);
- ``commands``: ``hf-fedflat train | compare | partition | list | sweep``; ``__main__`` runs it
  (``python -m hf_fedflat.cli``, ``accelerate launch -m hf_fedflat.cli train ...``).

The names below load on first use, like the rest of the package's (:mod:`hf_fedflat._lazy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import attach, exported_names

_EXPORTS = {
    ".commands": ("main",),
    ".experiment": ("Experiment", "build_experiment", "run_experiment"),
    ".parsing": ("ConfigError", "parse_arguments", "parse_train_args"),
    ".summary": ("RunSummary", "summarize_run"),
}
__getattr__, __dir__ = attach(__name__, _EXPORTS, globals())
__all__ = exported_names(_EXPORTS)

if TYPE_CHECKING:
    from .commands import main
    from .experiment import Experiment, build_experiment, run_experiment
    from .parsing import ConfigError, parse_arguments, parse_train_args
    from .summary import RunSummary, summarize_run
