"""The run's own callbacks (partition files) and report_to logging; the base is :mod:`hf_fedflat.callbacks`."""

from __future__ import annotations

import os
from typing import Any

from transformers import TrainerControl, TrainerState
from transformers.integrations import get_reporting_integration_callbacks

from ..callbacks import FederatedCallback

__all__ = ["FederatedCallback", "PartitionFilesCallback", "RoundReporter"]


class PartitionFilesCallback(FederatedCallback):
    """Writes ``partition.json`` (per-client indices and label counts) and ``partition_heatmap.png`` into
    ``output_dir`` when the run starts (every trainer adds it)."""

    def on_train_begin(self, trainer, **kwargs: Any) -> None:
        from ..data import plot_partition_heatmap

        args, partition = trainer.args, trainer.partition
        os.makedirs(args.output_dir, exist_ok=True)
        partition.save_json(os.path.join(args.output_dir, "partition.json"))
        plot_partition_heatmap(partition, os.path.join(args.output_dir, "partition_heatmap.png"),
                               title=f"{partition.describe_scheme()}, {args.num_clients} clients")


class RoundReporter:
    """Sends one log per round (step = round number) to every ``report_to`` integration.

    Reuses transformers' own integration callbacks (TensorBoard, W&B, MLflow, ...), driven with a
    ``TrainerState`` whose ``global_step`` is the round.
    """

    def __init__(self, args, model=None):
        self.args = args
        self.model = model
        self.state = TrainerState(is_world_process_zero=True)
        self.control = TrainerControl()
        self.integrations = [cls() for cls in get_reporting_integration_callbacks(args.report_to)]
        self._started = False

    def log(self, round_number: int, metrics: dict) -> None:
        if not self.integrations:
            return
        if not self._started:
            for integration in self.integrations:
                integration.on_train_begin(self.args, self.state, self.control, model=self.model)
            self._started = True
        self.state.global_step = round_number
        scalars = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        for integration in self.integrations:
            integration.on_log(self.args, self.state, self.control, logs=scalars)

    def close(self) -> None:
        if self._started:
            for integration in self.integrations:
                integration.on_train_end(self.args, self.state, self.control, model=self.model)
            self._started = False
