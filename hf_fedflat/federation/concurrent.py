"""``concurrent_clients``: a process trains up to K clients of its round share at once.

The lanes (:mod:`hf_fedflat.runtime.lanes`) are built on the first share with more than one client: lane 0
is the process's own local Trainer and model, lanes 1..K-1 each a deep copy of the model in a new
``ClientTrainer`` of the same class, arguments (a copy: ``start_client`` sets the learning rate and local work on
them), collator and metrics. Every client then runs through the same code as one at a time
(``LocalTraining.train_safely`` -> ``trainer.train_client`` -> ``LocalTraining.train``, which takes the model of the
lane its thread runs): the composed pieces, the client state, the failure policy (a client raising in a lane is
excluded and recorded like any other), the per-client seeds. Results are gathered in the share's order, so the
strategy aggregates the same updates in the same order: the same weights, bit for bit on a CPU (tested).

Memory: K models, K optimizer states, K clients' activations and batches, K sets of step scratch vectors.
"""

from __future__ import annotations

import copy
import logging
import time

import torch

from ..runtime.lanes import Lane, RngGuard, instrument, run_lanes

logger = logging.getLogger(__name__)

__all__ = ["ConcurrentClients"]


class ConcurrentClients:
    """Trains a share of clients ``count`` at a time for one :class:`~.client.LocalTraining`."""

    def __init__(self, local_training, count: int):
        self.local_training = local_training
        self.count = count
        self.lanes: list[Lane] = []
        self.guard: RngGuard | None = None

    def _build(self) -> list[Lane]:
        if self.lanes:
            return self.lanes
        from ..training import BufferSpace

        local = self.local_training
        main = local.client_trainer
        if main.is_deepspeed_enabled or main.is_fsdp_enabled:
            raise ValueError("concurrent_clients: a DeepSpeed or FSDP model cannot be copied per client; use 1.")
        device = main.space.device
        self.guard = RngGuard(device)
        lanes = [Lane(0, main, local.buffer_space)]
        for index in range(1, self.count):
            model = copy.deepcopy(main.model)
            trainer = type(main)(
                model=model, args=copy.copy(main.args), data_collator=main.data_collator,
                compute_metrics=main.compute_metrics, processing_class=main.processing_class,
                preprocess_logits_for_metrics=main.preprocess_logits_for_metrics,
            )
            buffers = BufferSpace(trainer.model) if local.buffer_space is not None else None
            lanes.append(Lane(index, trainer, buffers))
        for lane in lanes:
            if device.type == "cuda":
                lane.stream = torch.cuda.Stream(device=device)
            instrument(lane.trainer, self.guard)
        logger.info("concurrent_clients=%d: %d more copies of the model (%d parameters each)", self.count,
                    self.count - 1, main.space.numel)
        self.lanes = lanes
        return lanes

    def train_share(self, trainer, round_index: int, learning_rate: float, client_ids: list[int], received: dict,
                    round_start: float, watch) -> tuple[list, dict[int, str]]:
        """The round loop's ``_train_share`` for ``trainer``'s clients ``client_ids``, up to ``count`` at once:
        ``(updates in the share's order, {client id: why it is excluded})``."""
        args, local = trainer.args, self.local_training
        lanes = self._build()
        for client_id in client_ids:  # in this thread: each client's rows are built once (and materialised)
            if local.client_sizes[client_id] > 0:
                local.client_dataset(client_id)
        for lane in lanes[1:]:  # (materialised data come with their own collator)
            lane.trainer.data_collator = local.client_trainer.data_collator
        starts = {client_id: trainer.strategy.client_start(client_id, received) for client_id in client_ids}
        deadline = args.round_deadline_seconds

        def work(lane: Lane, client_id: int):
            if deadline and time.perf_counter() - round_start > deadline:
                return None, f"straggler: round deadline of {deadline}s passed"
            # through the trainer's train_client, so that a wrapper set on the trainer (fault injection) runs
            return local.train_safely(trainer.train_client, client_id, round_index, learning_rate, starts[client_id])

        poll = None if trainer.comm.distributed else (lambda: watch.check(f" during round {round_index + 1}"))
        if poll is not None:
            poll()
        results = run_lanes(lanes, self.guard, client_ids, work, poll=poll)
        updates, failures = [], {}
        for client_id, (update, failure) in zip(client_ids, results):
            if failure is not None:
                failures[client_id] = failure
                continue
            updates.append(update)
            trainer.call_callbacks("on_client_end", round_index, update)
        return updates, failures
