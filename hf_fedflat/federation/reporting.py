"""What a run reports besides its history: the partition files (a callback every trainer adds) and the
per-round ``report_to`` logging. The callback base is :mod:`hf_fedflat.callbacks`."""

from __future__ import annotations

import os
from typing import Any

from transformers import TrainerControl, TrainerState
from transformers.integrations import get_reporting_integration_callbacks

from ..callbacks import FederatedCallback

__all__ = ["RUN_ENTRIES", "PartitionFilesCallback", "RoundReporter", "run_entries"]

#: what a run writes into its output_dir (files and folders); none of them may be a symbolic link (``runs``: the
#: loggers' folder, e.g. TensorBoard's events; ``run.lock``: the folder's lock, see federation.run_folder)
RUN_ENTRIES = ("partition.json", "partition_heatmap.png", "data_validation.json", "history.json", "run_status.json",
               "final_model", "checkpoints", "client_states", "client_states_gossip_staging", "smoke_data",
               "smoke_assets", "runs", "run.lock")


def run_entries(args) -> list[str]:
    """:data:`RUN_ENTRIES`, and ``client_state_dir`` when it is set inside ``output_dir``."""
    entries = list(RUN_ENTRIES)
    state_dir = getattr(args, "client_state_dir", None)
    if state_dir:
        relative = os.path.relpath(os.path.abspath(state_dir), os.path.abspath(args.output_dir))
        if relative != os.curdir and not relative.startswith(os.pardir):
            entries += [relative, relative + "_gossip_staging"]
    return entries


class PartitionFilesCallback(FederatedCallback):
    """Writes ``partition.json`` (per-client indices and label counts) and ``partition_heatmap.png`` into
    ``output_dir`` when the run starts (every trainer adds it), and ``data_validation.json`` (what the input
    check found and dropped, :mod:`hf_fedflat.data.input_checks`).

    Before writing anything it refuses a symbolic link among the run's own entries of ``output_dir``
    (:data:`RUN_ENTRIES`, the client-state folder, and anything inside them): a link planted there would make
    a later write (a checkpoint, ``final_model/``) land outside the run's folder.
    """

    def on_train_begin(self, trainer, **kwargs: Any) -> None:
        from ..data import plot_partition_heatmap
        from ..io import atomic_write_json, refuse_symlinks_in

        args, partition = trainer.args, trainer.partition
        refuse_symlinks_in(args.output_dir, run_entries(args))
        os.makedirs(args.output_dir, exist_ok=True)
        partition.save_json(os.path.join(args.output_dir, "partition.json"), root=args.output_dir)
        plot_partition_heatmap(partition, os.path.join(args.output_dir, "partition_heatmap.png"),
                               title=f"{partition.describe_scheme()}, {args.num_clients} clients", root=args.output_dir)
        report = getattr(trainer, "input_report", None)
        if report is not None:
            atomic_write_json(report.to_dict(), os.path.join(args.output_dir, "data_validation.json"),
                              root=args.output_dir)


class RoundReporter:
    """Sends one log per round (step = round number) to every ``report_to`` integration.

    Reuses transformers' own integration callbacks (TensorBoard, W&B, MLflow, ...), driven with a
    ``TrainerState`` whose ``global_step`` is the round. The numbers go to every integration; a causal LM's
    ``generations`` (prompts and their continuations) to TensorBoard as text.
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
        generations = metrics.get("generations")
        if generations:  # a causal LM's sample continuations: text where the logger takes text (TensorBoard)
            text = "\n\n".join(f"**{g['prompt']}** {g['completion']}" for g in generations)
            for integration in self.integrations:
                writer = getattr(integration, "tb_writer", None)
                if writer is not None:
                    writer.add_text("eval/generations", text, round_number)

    def close(self) -> None:
        if self._started:
            for integration in self.integrations:
                integration.on_train_end(self.args, self.state, self.control, model=self.model)
            self._started = False
