"""One client's local round, and the failure policy that decides whether its update is aggregated."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from ..algorithms import ClientContext, ClientUpdate, LocalResult
from ..diagnostics.run import DIAGNOSTICS_MESSAGE
from ..training.parameters import all_finite
from ..runtime.fast_trainer import materialized_training_data
from ..runtime.lanes import current_lane
from ..runtime.vectors import empty_like
from .concurrent import ConcurrentClients
from .load_balance import local_work
from ..sampling import derive_seed

logger = logging.getLogger(__name__)


@dataclass
class ClientStart:
    """What a client starts its local round from (a strategy's answer for one client)."""

    params: torch.Tensor
    broadcast: dict = field(default_factory=dict)
    state: dict = field(default_factory=dict)
    buffers: torch.Tensor | None = None


class LocalTraining:
    """Trains one client at a time on this process, with the run's local ``ClientTrainer``.

    Args:
        client_trainer: the process's ``ClientTrainer`` (holds the model).
        algorithm: the run's ``FederatedAlgorithm`` (its pieces start and end each client).
        args: the run's arguments (local epochs/steps, batch size, seed, ...).
        partition, train_dataset: which rows each client trains on.
        buffer_space: the model's averaged buffers (``batchnorm_buffers="average"``), else None.
        diagnostics: the run's ``RunDiagnostics`` (a client may add a diagnostics message).
    """

    def __init__(self, client_trainer, algorithm, args, partition, train_dataset, buffer_space, diagnostics):
        self.client_trainer, self.algorithm, self.args = client_trainer, algorithm, args
        self.space, self.buffer_space, self.diagnostics = client_trainer.space, buffer_space, diagnostics
        self.partition, self.train_dataset = partition, train_dataset
        self.client_sizes = [int(n) for n in partition.num_samples]
        self._client_datasets: dict[int, Any] = {}  # index views, built once per client
        self._materialized = None  # runtime.materialize.Materialized, False (not applicable) or None (not yet known)
        #: several clients at once (``concurrent_clients > 1``; the round loop hands it the process's share)
        self.concurrent = ConcurrentClients(self, args.concurrent_clients) if getattr(
            args, "concurrent_clients", 1) > 1 else None

    def load_weights(self, params: torch.Tensor, buffers: torch.Tensor | None = None) -> None:
        """Put ``params`` (and ``buffers``, when averaged) into the model."""
        self.space.load_(params)
        if self.buffer_space is not None and buffers is not None:
            self.buffer_space.load_(buffers)

    def client_dataset(self, client_id: int):
        """The client's rows: a ``datasets`` subset, or a view of the materialised columns (``runtime.materialize``)."""
        if client_id not in self._client_datasets:
            if self._materialized is None:  # decided once per run, at the first client
                self._materialized = self._materialize()
            if self._materialized:  # no datasets subset (a select per client) is built then
                dataset = self._materialized.rows(self.partition.client_indices[client_id])
            else:
                dataset = self.partition.client_dataset(self.train_dataset, client_id)
            self._client_datasets[client_id] = dataset
        return self._client_datasets[client_id]

    def _materialize(self):
        """The training data as tensors (the runtime's ``materialize``), or False where that does not apply."""
        materialized = materialized_training_data(self.client_trainer, self.train_dataset)
        return False if materialized is None else materialized

    def local_work(self, client_id: int) -> tuple[int, int]:
        """``(optimizer steps, samples forwarded)`` of the client's local run (the Trainer's schedule)."""
        args = self.args
        return local_work(
            self.client_sizes[client_id], args.per_device_train_batch_size, local_steps=args.local_steps,
            local_epochs=args.local_epochs, gradient_accumulation_steps=args.gradient_accumulation_steps,
            drop_last=args.dataloader_drop_last,
        )

    def train(self, client_id: int, round_index: int, learning_rate: float, global_params: torch.Tensor,
              broadcast: dict, state: dict, global_buffers: torch.Tensor | None = None) -> ClientUpdate:
        """Local training of one client from ``global_params``; returns its update (CPU tensors)."""
        started = time.perf_counter()
        lane = current_lane()  # concurrent_clients > 1: this thread's own model and Trainer
        trainer = self.client_trainer if lane is None else lane.trainer
        space, buffer_space = trainer.space, self.buffer_space if lane is None else lane.buffer_space
        device = space.device
        trainer.release_memory()  # earlier clients' freed buffers back to the OS, if they piled up
        space.load_(global_params)
        if buffer_space is not None and global_buffers is not None:
            buffer_space.load_(global_buffers)
        ctx = ClientContext(
            client_id=client_id,
            round=round_index,
            global_params=global_params.to(device),
            broadcast={p: {k: t.to(device) for k, t in part.items()} for p, part in broadcast.items()},
            state={p: {k: t.to(device) for k, t in part.items()} for p, part in state.items()},
            learning_rate=learning_rate,
            num_samples=self.client_sizes[client_id],
            full_gradient=lambda: trainer.full_gradient(self.client_dataset(client_id)),
        )
        workspaces = self.algorithm.begin_client(ctx)
        dataset = self.client_dataset(client_id)
        diagnostics = self.diagnostics.client_message(trainer, self.algorithm.perturbation, workspaces, dataset)
        trainer.start_client(
            dataset, learning_rate=learning_rate, algorithm=self.algorithm, workspaces=workspaces,
            local_epochs=self.args.local_epochs, local_steps=self.args.local_steps,
        )
        # Same (seed, round, client) -> same shuffle and dropout, on any process, after any resume.
        trainer.seed_for_client(derive_seed(self.args.seed, round_index, client_id))
        output = trainer.train()
        delta = space.difference(ctx.global_params, out=empty_like(ctx.global_params))
        result = LocalResult(params=space.flatten, num_steps=int(trainer.state.global_step), delta=delta)
        new_state, messages = self.algorithm.end_client(ctx, workspaces, result)
        # what leaves this client of its update: +dp's client mode clips and noises it here, on the client itself
        delta = self.algorithm.release_update(ctx, delta)
        if diagnostics:
            messages[DIAGNOSTICS_MESSAGE] = diagnostics
        cpu = lambda parts: {p: {k: t.detach().cpu() for k, t in part.items()} for p, part in parts.items()}  # noqa: E731
        return ClientUpdate(
            client_id=client_id,
            num_samples=ctx.num_samples,
            num_steps=result.num_steps,
            train_loss=float(output.training_loss),
            delta=delta.cpu(),
            messages=cpu(messages),
            state=cpu(new_state),
            buffers=buffer_space.flatten().cpu() if buffer_space is not None else None,
            train_seconds=time.perf_counter() - started,
        )

    def train_safely(self, train: Callable[..., ClientUpdate], client_id: int, round_index: int,
                     learning_rate: float, start: ClientStart) -> tuple[ClientUpdate | None, str | None]:
        """``(update, None)``, or ``(None, reason)`` for a client that must not be aggregated: its training
        raised, it ran no optimizer step, its loss or update is not finite or the update's norm exceeds
        ``max_update_norm``, or it has no data (with ``dataloader_drop_last``: not one full batch). ``train`` is
        the trainer's ``train_client``."""
        if self.client_sizes[client_id] == 0:
            return None, "empty dataset: skipped"
        if self.local_work(client_id)[0] == 0:  # only with drop_last: no full batch, nothing to train on
            return None, (f"{self.client_sizes[client_id]} rows, fewer than one batch of "
                          f"{self.args.per_device_train_batch_size} with dataloader_drop_last: skipped")
        inputs = (start.params, start.broadcast, start.state, start.buffers)
        try:
            update = train(client_id, round_index, learning_rate, *inputs)
        except Exception as error:  # one bad client must not end the run (KeyboardInterrupt still does)
            logger.warning("Round %d: client %d raised during local training", round_index + 1, client_id,
                           exc_info=True)
            return None, f"training raised {type(error).__name__}: {error}"
        if update.num_steps <= 0:  # trained nothing: its "update" is the model it received
            return None, f"trained {update.num_steps} optimizer steps: nothing to aggregate"
        # What the client received (w^t, the broadcast, its stored state) is finite already: a piece handing one
        # back as its new state (LESAM's w_old_i is w^t) costs no second pass over it per client.
        received = {_memory_of(t) for t in _tensors_in(inputs)}
        tensors = [update.delta, *(t for part in (update.messages, update.state) for d in part.values() for t in d.values())]
        if not all_finite([t for t in tensors if _memory_of(t) not in received]):
            return None, "update contains NaN or Inf"
        if not math.isfinite(update.train_loss):  # (e.g. mixed precision skipped every step of a NaN loss)
            return None, f"training loss is {update.train_loss}"
        limit = self.args.max_update_norm
        if limit is not None:
            norm = float(torch.linalg.vector_norm(update.delta))
            if norm > limit:
                return None, f"update norm {norm:.4g} exceeds max_update_norm={limit}"
        return update, None


class FailurePolicy:
    """Logs excluded clients, names why a round aggregated nothing, and stops a run in which no client was
    aggregated for ``max_consecutive_failed_rounds`` rounds in a row, whatever the reason (clients raised,
    non-finite or oversized updates, stragglers, clients without a full batch, a refused non-finite server
    step, ...): such a run is not training. 0 never stops early (the run still fails at the end when no
    round aggregated anything).

    A round failed when its record says ``num_clients == 0``; the count is read back from the history, so it
    carries over a resume."""

    def __init__(self, max_consecutive_failed_rounds: int):
        self.limit = max_consecutive_failed_rounds

    def log(self, round_index: int, failures: dict[int, str]) -> None:
        for client_id, reason in sorted(failures.items()):
            logger.warning("Round %d: client %d excluded from aggregation: %s", round_index + 1, client_id, reason)

    @staticmethod
    def round_failure(num_sampled: int, failures: dict[int, str]) -> str:
        """Why a round aggregated no client, in one line (``failed_clients`` lists every client's reason)."""
        if not failures:
            return f"no client aggregated ({num_sampled} sampled)"
        client, reason = min(failures.items())
        return f"no client aggregated: {len(failures)} of {num_sampled} sampled excluded, e.g. client {client}: {reason}"

    def check(self, history: list[dict]) -> str | None:
        """The reason to stop the run now, or None."""
        failed = 0
        for record in reversed(history):
            if record.get("num_clients", 0) > 0:
                break
            failed += 1
        if not self.limit or failed < self.limit:
            return None
        last = history[-1]
        reason = last.get("round_failed", "no client aggregated")
        hint = ("this looks like a bug in the data or model rather than bad clients"
                if all(f["reason"].startswith("training raised") for f in last.get("failed_clients", [{"reason": ""}]))
                else "the run is not training")
        return (f"No client was aggregated for {failed} consecutive rounds (rounds {last['round'] - failed + 1}-"
                f"{last['round']}); last round: {reason}. {hint[0].upper() + hint[1:]}: fix the cause, or raise "
                "max_consecutive_failed_rounds (0 never stops early).")


def _memory_of(tensor: torch.Tensor) -> tuple:
    """Which memory a tensor reads (the same for a tensor and its ``detach()``)."""
    return tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tuple(tensor.stride()), tensor.device


def _tensors_in(values) -> Iterator[torch.Tensor]:
    """The tensors in ``values``, in nested dicts, lists and tuples."""
    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, dict):
            yield from _tensors_in(value.values())
        elif isinstance(value, (list, tuple)):
            yield from _tensors_in(value)
