"""What every script in ``recipes/`` shares: its defaults, ``--smoke``, flags and YAML, one experiment.

A recipe is a list of default flags (the paper's set-up, Hub data, pretrained weights) and a list of
``--smoke`` overrides (tiny generated data in the real on-disk format, a tiny model, one or two rounds).
Everything a user passes wins over both: flags, or ``--config run.yaml`` (any field of
``DataArguments``, ``ModelArguments``, ``LoraArguments`` and ``FedTrainingArguments``), parsed by the one loader
of every entry point (:func:`hf_fedflat.cli.parsing.parse_arguments`). ``--help`` shows the recipe's docstring and
its defaults.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence

from ..federation.comm import init_federated_process_group

__all__ = ["recipe_argv", "run_recipe", "smoke_asset_flags"]

logger = logging.getLogger(__name__)


def recipe_argv(argv: Sequence[str], defaults: Sequence[str], smoke: Sequence[str] = ()) -> list[str]:
    """``defaults``, then ``smoke`` if ``--smoke`` is given, then the user's arguments (argparse keeps the last).

    Kept for scripts that build their own argument list; :func:`run_recipe` passes the lists to the parser
    instead, so a ``--config`` file also wins over the recipe's defaults."""
    from .parsing import wants_smoke

    argv = list(argv)
    return [*defaults, *(smoke if wants_smoke(argv) else ()), *argv]


def smoke_asset_flags(argv: Sequence[str], smoke: Sequence[str], default_output_dir: str,
                      paths: dict[str, str]) -> tuple[list[str], str]:
    """A recipe's ``--smoke`` flags whose ``paths`` (flag -> path inside the assets folder) point into
    ``<output_dir>/smoke_assets``, the ``--output_dir`` given or else ``default_output_dir``; and that folder (where the
    recipe writes its tiny offline model and data)."""
    argv = list(argv)
    output_dir = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--output_dir"), None)
    output_dir = output_dir or next((a.split("=", 1)[1] for a in argv if a.startswith("--output_dir=")),
                                    default_output_dir)
    assets = os.path.join(output_dir, "smoke_assets")
    flags = list(smoke)
    for flag, path in paths.items():
        flags[flags.index(flag) + 1] = os.path.join(assets, path)
    return flags, assets


def run_recipe(argv: Sequence[str] | None, defaults: Sequence[str], smoke: Sequence[str] = (), *,
               description: str | None = None, prog: str | None = None):
    """Parse, build, train; prints the final metrics. Returns ``(experiment, output)``.

    ``description`` (``--help``'s text) and ``prog`` default to the calling recipe module's docstring and file name.
    """
    from .parsing import parse_train_args
    from .experiment import run_experiment

    caller = sys._getframe(1).f_globals
    description = description if description is not None else caller.get("__doc__")
    prog = prog or os.path.basename(caller.get("__file__") or sys.argv[0] or "recipe")
    group = init_federated_process_group()  # before the arguments set up accelerate
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    data_args, model_args, lora_args, args = parse_train_args(argv, defaults=defaults, smoke=smoke, prog=prog,
                                                              description=description)
    experiment, output = run_experiment(data_args, model_args, args, lora_args=lora_args)
    if group.is_main:
        from ..hub.card import primary_metric

        # the metric the model card ranks by: accuracy, entity F1 (token classification), perplexity (causal LM)
        metric = primary_metric(output.history, experiment.data.task) or "eval_accuracy"
        last = next((r for r in reversed(output.history) if metric in r), {})
        print(f"\n{experiment.args.algorithm_label} on {experiment.data.name}: {len(output.history)} rounds, "
              f"final {metric.removeprefix('eval_').replace('_', ' ')} {last.get(metric, float('nan')):.4f}; "
              f"model and card in {output.final_model_dir}")
    return experiment, output
