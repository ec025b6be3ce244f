"""The ServerApp: hf_fedflat's server strategy and round loop on a Flower federation.

The ServerApp builds the run exactly as ``hf-fedflat train`` does from the App's settings (its held-out data, the
initial model from the seed, the algorithm, the run folder with its lock and ``run_status.json``), then runs the same
round loop (:func:`hf_fedflat.federation.loop.run_rounds`) with the round's clients trained on the SuperNodes
(:class:`.server_clients.FlowerClients`) instead of the launch's processes: the same seeded sampling, what the
aggregator sends, every aggregator and plug-in, evaluation, ``history.json``, checkpoints, divergence and failure
guards, ``final_model/`` with its card. The client states stay on the nodes.

Bad settings end the ServerApp before its first round with one line naming the field (exit status 2); a run that
trained nothing exits 3, as ``hf-fedflat train`` does.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["FedFlatStrategy", "run_server", "serve", "server_app"]


def run_server(grid, run_config: dict[str, Any]):
    """Run the federation's rounds from the App's settings; returns the trainer's output (raises as the CLI's
    ``train`` does: :class:`~hf_fedflat.cli.parsing.ConfigError`, ``TrainingFailedError``)."""
    from ..algorithms import build_algorithm
    from ..cli.experiment import build_experiment
    from ..cli.final_evaluation import run_final_evaluation
    from ..field_checks import ConfigError
    from .server_clients import FlowerClients
    from .settings import DEPLOYMENT_DEFAULTS, parse_run_config

    deployment = {k: float(run_config.get(k, v)) for k, v in DEPLOYMENT_DEFAULTS.items()}
    data_args, model_args, lora_args, args = parse_run_config(run_config)
    if build_algorithm(args).aggregator.capabilities.decentralized:
        raise ConfigError(f"fed_algorithm: {args.fed_algorithm!r} is decentralized (clients gossip with neighbours, "
                          "there is no server); a Flower deployment runs the server algorithms.")
    experiment = build_experiment(data_args, model_args, args, lora_args=lora_args)
    trainer = experiment.trainer
    trainer.round_clients = FlowerClients(grid, reply_timeout=deployment["flower_reply_timeout"],
                                          connect_timeout=deployment["flower_connect_timeout"])
    trainer.strategy.client_states_here = False  # each SuperNode keeps its client's state
    output = trainer.train()
    run_final_evaluation(trainer, experiment.data, experiment.args)
    return output


class FedFlatStrategy:
    """hf_fedflat's server as a strategy object, for a ServerApp of your own: ``start(grid)`` runs the rounds (the
    seeded sampling, what the algorithm sends, its aggregator and plug-ins, evaluation, checkpoints, the final model)
    with the round's clients trained on the grid's SuperNodes.

    ``settings`` are the run's App settings: ``context.run_config``, or ``arguments_settings(training_args, ...)``
    for arguments built in Python (:meth:`from_arguments`). The nodes' ClientApp must train with the same settings
    (``client_app(settings=...)``, or the App's ``run_config``)."""

    def __init__(self, settings: dict[str, Any]):
        self.settings = dict(settings)

    @classmethod
    def from_arguments(cls, training_args, *other_arguments) -> "FedFlatStrategy":
        """From ``FedTrainingArguments`` (and optionally the data, model and LoRA arguments)."""
        from .settings import arguments_settings

        return cls(arguments_settings(training_args, *other_arguments))

    def start(self, grid, num_rounds: int | None = None, timeout: float | None = None):
        """Run the rounds on ``grid``; ``num_rounds`` and ``timeout`` (seconds to wait for a round's replies) replace
        the settings' ``num_rounds`` and ``flower_reply_timeout``. Returns the trainer's output (its
        ``final_model_dir``, ...)."""
        settings = dict(self.settings)
        if num_rounds is not None:
            settings["num_rounds"] = num_rounds
        if timeout is not None:
            settings["flower_reply_timeout"] = timeout
        return run_server(grid, settings)


def serve(grid, context) -> None:
    """The ServerApp's ``main``: :func:`run_server` on the App's settings, its outcome in one line (exit status 2 for
    bad settings, 3 for a run that trained nothing, 4 for a full disk, as ``hf-fedflat train``)."""
    from ..cli.exit_codes import input_error_types, report_disk_full, report_input_error
    from ..federation.outcome import EXIT_TRAINING_FAILED, TrainingFailedError

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # (a line per request to the SuperLink otherwise)
    try:
        output = run_server(grid, dict(context.run_config))
    except TrainingFailedError as failed:
        print(f"hf-fedflat ServerApp: training failed: {failed.reason}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_TRAINING_FAILED) from None
    except input_error_types() as error:
        raise SystemExit(report_input_error("hf-fedflat ServerApp", error)) from None
    except Exception as error:  # a full disk: one line naming the file and the checkpoint to resume from
        status = report_disk_full("hf-fedflat ServerApp", error)
        if status is None:
            raise
        raise SystemExit(status) from None
    print(f"hf-fedflat ServerApp: final model and model card: {output.final_model_dir}", flush=True)


def server_app():
    """hf_fedflat's Flower ``ServerApp`` (the App's ``serverapp`` component)."""
    from flwr.serverapp import ServerApp

    app = ServerApp()
    app.main()(serve)
    return app
