"""``FederatedTrainer``: the round loop (sample, train locally, gather, aggregate, broadcast, evaluate)."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import TrainingArguments

from ..algorithms import ClientContext, ClientUpdate, LocalResult, build_algorithm
from ..algorithms.base import weighted_sum
from ..config import FedTrainingArguments
from ..diagnostics import RunDiagnostics, tensor_bytes
from ..diagnostics.run import DIAGNOSTICS_MESSAGE
from ..io import RecordLog, atomic_save_safetensors, atomic_write_json
from ..state import create_client_state_store
from ..state.store import flatten_state, unflatten_state
from .. import vectors
from ..training import BufferSpace, ClientTrainer
from ..training.parameters import all_finite
from .callbacks import FederatedCallback, RoundReporter
from .checkpoint import CheckpointError, load_checkpoint, resolve_checkpoint, save_checkpoint
from .comm import get_process_group, quiet_process_group_warning
from .load_balance import ClientCostModel, assign_to_processes, local_work
from .sampling import derive_seed, sample_clients

logger = logging.getLogger(__name__)

# The federated loop owns these; the local Trainer must not checkpoint, evaluate, log or push by itself.
_LOCAL_OVERRIDES = dict(
    save_strategy="no", eval_strategy="no", logging_strategy="no", report_to="none", push_to_hub=False,
    load_best_model_at_end=False, disable_tqdm=True, resume_from_checkpoint=None, max_steps=-1,
    # A fixed data_seed would give every client the same shuffle in every round; the order comes from
    # the seed derived per (seed, round, client) instead (accelerate's sampler reads torch's seed).
    data_seed=None,
    # a client whose loss is NaN reports it (its update is then rejected as not finite) instead of the
    # Trainer's running average in its place
    logging_nan_inf_filter=False,
)
#: settings that must match for a checkpoint to be resumed
FINGERPRINT_FIELDS = (
    "fed_algorithm", "perturbation", "corrections", "aggregator", "num_clients", "seed", "partition_scheme",
    "dirichlet_alpha", "classes_per_client", "min_partition_size", "effective_partition_seed",
)


def local_training_arguments(args: FedTrainingArguments) -> TrainingArguments:
    """A plain ``TrainingArguments`` for the per-client Trainer, built once per process.

    (A new ``TrainingArguments`` resets accelerate's global state, so it is never rebuilt per client.)
    """
    names = {f.name for f in dataclasses.fields(TrainingArguments) if f.init}
    values = {name: getattr(args, name) for name in names}
    values.update(_LOCAL_OVERRIDES)
    if args.use_cpu or not torch.cuda.is_available():
        values["dataloader_pin_memory"] = False  # nothing to pin to; avoids a warning per client
    with quiet_process_group_warning():
        return TrainingArguments(**values)


def accuracy_metrics(eval_prediction) -> dict[str, float]:
    """Top-1 accuracy from logits (no Hub metric script needed)."""
    logits = eval_prediction.predictions[0] if isinstance(eval_prediction.predictions, tuple) else eval_prediction.predictions
    return {"accuracy": float((np.argmax(logits, axis=-1) == eval_prediction.label_ids).mean())}


@dataclass
class FederatedTrainOutput:
    params: torch.Tensor
    history: list[dict]
    final_model_dir: str | None


class FederatedTrainer:
    """Runs a federated experiment with any registered algorithm.

    Args:
        model: the model to federate (its trainable parameters are the federated state). Returns a
            ``loss`` when given ``labels``.
        args: the run's :class:`FedTrainingArguments`.
        train_dataset: the full training set; it is split into ``args.num_clients`` clients.
        eval_dataset: held-out data for the global model.
        partition: a precomputed :class:`~hf_fedflat.data.ClientPartition`; by default one is made from
            ``args`` (scheme, alpha, seed) on ``train_dataset``'s ``label_column``.
        label_column: column the partitioner reads labels from.
        data_collator, compute_metrics, processing_class: as for ``transformers.Trainer``
            (``compute_metrics`` defaults to accuracy).
        callbacks: :class:`FederatedCallback` instances.
        lora_save: for a LoRA (peft) model, save the final model ``"merged"`` into the base weights or as the
            ``"adapter"`` (+ head) only.
    """

    #: whether this trainer runs decentralized aggregators (gossip); see hf_fedflat.decentralized
    supports_decentralized = False

    def __init__(
        self,
        model: torch.nn.Module,
        args: FedTrainingArguments,
        train_dataset,
        eval_dataset=None,
        *,
        partition=None,
        label_column: str = "label",
        data_collator=None,
        compute_metrics=accuracy_metrics,
        processing_class=None,
        callbacks: list[FederatedCallback] | None = None,
        lora_save: str = "merged",
    ):
        self.args = args
        self.comm = get_process_group()
        self.algorithm = build_algorithm(args)
        self.train_dataset = train_dataset
        self.eval_dataset = eval_dataset
        if partition is None:
            from ..data import partition_dataset

            partition = partition_dataset(
                train_dataset, args.num_clients, args.partition_scheme, label_column=label_column,
                alpha=args.dirichlet_alpha, classes_per_client=args.classes_per_client,
                min_partition_size=args.min_partition_size, seed=args.effective_partition_seed,
            )
        if partition.num_clients != args.num_clients:
            raise ValueError(f"num_clients: the partition has {partition.num_clients} clients, args say {args.num_clients}.")
        self.partition = partition
        self.client_sizes = [int(n) for n in partition.num_samples]
        batch = args.per_device_train_batch_size
        small = sum(0 < n < batch for n in self.client_sizes) if args.dataloader_drop_last else 0
        if small:
            logger.warning("%d of %d clients have fewer rows than one batch (%d) and dataloader_drop_last is set: "
                           "they will be skipped whenever sampled", small, len(self.client_sizes), batch)
        self._client_datasets: dict[int, Any] = {}  # index views, built once per client
        #: seconds per client predicted from earlier clients' times (main process; splits rounds across processes)
        self.cost_model = ClientCostModel()
        self.callbacks = list(callbacks or [])
        #: dataset name/id, base model, task: extra details for the model card (recipes and the CLI fill it)
        self.model_card_kwargs: dict[str, Any] = {}
        if args.push_to_hub:
            from ..hub import HubPushCallback  # (hub imports federation: import here)

            if not any(isinstance(c, HubPushCallback) for c in self.callbacks):
                self.callbacks.append(HubPushCallback())
        if args.batchnorm_buffers == "error":
            from ..models import batchnorm_modules

            found = batchnorm_modules(model)
            if found:
                raise ValueError(
                    f"batchnorm_buffers: the model has BatchNorm layers ({', '.join(found[:3])}"
                    f"{', ...' if len(found) > 3 else ''}) whose running statistics are not parameters. Use a GroupNorm "
                    "model (e.g. create_model('resnet18_gn', ...), as the federated papers do) or set "
                    "batchnorm_buffers='average' to average the statistics across clients."
                )
        self.client_trainer = ClientTrainer(
            model=model, args=local_training_arguments(args), data_collator=data_collator,
            compute_metrics=compute_metrics, processing_class=processing_class,
        )
        if getattr(self.algorithm.aggregator, "decentralized", False) and not self.supports_decentralized:
            raise ValueError(
                f"aggregator: {self.algorithm.aggregator.name!r} is decentralized (gossip, no server); build the "
                "trainer with hf_fedflat.create_trainer(...) or DecentralizedTrainer(...)."
            )
        self.model = self.client_trainer.model
        self.space = self.client_trainer.space
        self.lora_save = lora_save
        # Under LoRA a checkpoint holds adapters + head only: resuming is right only on the same frozen base.
        self._frozen_digest = None
        if any(not p.requires_grad for p in self.model.parameters()):
            from ..models.lora import frozen_parameter_digest

            self._frozen_digest = frozen_parameter_digest(self.model)
        self.buffer_space = BufferSpace(self.model) if args.batchnorm_buffers == "average" else None
        self.history: list[dict] = []
        self.diagnostics = RunDiagnostics(self)
        self._rounds_all_raised = 0
        self.store = None
        if self.comm.is_main:
            store_dir = args.client_state_dir or os.path.join(args.output_dir, "client_states")
            self.store = create_client_state_store(args.client_state_store, store_dir, args.client_state_memory_mb)

    # ---------------------------------------------------------------------------------------------
    def _fingerprint(self) -> dict[str, Any]:
        fp = {name: getattr(self.args, name) for name in FINGERPRINT_FIELDS}
        fp["num_parameters"] = self.space.numel
        if self._frozen_digest is not None:
            fp["frozen_parameters_sha256"] = self._frozen_digest
        return fp

    def _call(self, hook: str, *args, **kwargs) -> None:
        for callback in self.callbacks:
            getattr(callback, hook)(self, *args, **kwargs)

    def _aggregation_weights(self, updates: list[ClientUpdate]) -> torch.Tensor:
        if self.args.aggregation_weights == "uniform":
            weights = torch.ones(len(updates), dtype=torch.float64)
        else:
            weights = torch.tensor([u.num_samples for u in updates], dtype=torch.float64)
        return weights / weights.sum()

    # ---------------------------------------------------------------------------------------------
    def train_client(
        self,
        client_id: int,
        round_index: int,
        learning_rate: float,
        global_params: torch.Tensor,
        broadcast: dict,
        state: dict,
        global_buffers: torch.Tensor | None = None,
    ) -> ClientUpdate:
        """Local training of one client from ``w^t``; returns its update (CPU tensors)."""
        started = time.perf_counter()
        device = self.space.device
        self.client_trainer.release_memory()  # earlier clients' freed buffers back to the OS, if they piled up
        self._load_global(global_params, global_buffers)
        ctx = ClientContext(
            client_id=client_id,
            round=round_index,
            global_params=global_params.to(device),
            broadcast={p: {k: t.to(device) for k, t in part.items()} for p, part in broadcast.items()},
            state={p: {k: t.to(device) for k, t in part.items()} for p, part in state.items()},
            learning_rate=learning_rate,
            num_samples=self.client_sizes[client_id],
        )
        workspaces = self.algorithm.begin_client(ctx)
        trainer = self.client_trainer
        if client_id not in self._client_datasets:
            self._client_datasets[client_id] = self.partition.client_dataset(self.train_dataset, client_id)
        diagnostics = self.diagnostics.client_message(ctx, workspaces, self._client_datasets[client_id])
        trainer.start_client(
            self._client_datasets[client_id],
            learning_rate=learning_rate, algorithm=self.algorithm, workspaces=workspaces,
            local_epochs=self.args.local_epochs, local_steps=self.args.local_steps,
        )
        # Same (seed, round, client) -> same shuffle and dropout, on any process, after any resume.
        trainer.seed_for_client(derive_seed(self.args.seed, round_index, client_id))
        output = trainer.train()
        delta = self.space.difference(ctx.global_params, out=vectors.empty_like(ctx.global_params))
        result = LocalResult(params=self.space.flatten, num_steps=int(trainer.state.global_step), delta=delta)
        new_state, messages = self.algorithm.end_client(ctx, workspaces, result)
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
            buffers=self.buffer_space.flatten().cpu() if self.buffer_space is not None else None,
            train_seconds=time.perf_counter() - started,
        )

    def _train_client_safely(self, client_id, round_index, *args) -> tuple[ClientUpdate | None, str | None]:
        """``(update, None)``, or ``(None, reason)`` for a client that must not be aggregated: its training
        raised, its update is not finite or its norm exceeds ``max_update_norm``, or it has no data (with
        ``dataloader_drop_last``: not one full batch)."""
        if self.client_sizes[client_id] == 0:
            return None, "empty dataset: skipped"
        if self.local_work(client_id)[0] == 0:  # only with drop_last: no full batch, nothing to train on
            return None, (f"{self.client_sizes[client_id]} rows, fewer than one batch of "
                          f"{self.args.per_device_train_batch_size} with dataloader_drop_last: skipped")
        try:
            update = self.train_client(client_id, round_index, *args)
        except Exception as error:  # one bad client must not end the run (KeyboardInterrupt still does)
            logger.warning("Round %d: client %d raised during local training", round_index + 1, client_id,
                           exc_info=True)
            return None, f"training raised {type(error).__name__}: {error}"
        # What the client received (w^t, the broadcast, its stored state) is finite already: a piece handing one
        # back as its new state (LESAM's w_old_i is w^t) costs no second pass over it per client.
        received = {_memory_of(t) for t in _tensors_in(args)}
        tensors = [update.delta, *(t for part in (update.messages, update.state) for d in part.values() for t in d.values())]
        if not all_finite([t for t in tensors if _memory_of(t) not in received]):
            return None, "update contains NaN or Inf"
        limit = self.args.max_update_norm
        if limit is not None:
            norm = float(torch.linalg.vector_norm(update.delta))
            if norm > limit:
                return None, f"update norm {norm:.4g} exceeds max_update_norm={limit}"
        return update, None

    def _check_failures(self, round_index: int, num_sampled: int, updates, failures: dict[int, str]) -> None:
        for client_id, reason in sorted(failures.items()):
            logger.warning("Round %d: client %d excluded from aggregation: %s", round_index + 1, client_id, reason)
        raised = [r for r in failures.values() if r.startswith("training raised")]
        self._rounds_all_raised = self._rounds_all_raised + 1 if raised and len(raised) == num_sampled else 0
        limit = self.args.max_consecutive_failed_rounds
        if limit and self._rounds_all_raised >= limit:
            raise RuntimeError(
                f"Every sampled client raised during local training for {limit} consecutive rounds (last: "
                f"{raised[0]}); this looks like a bug in the data or model rather than bad clients. Fix it, or "
                "raise max_consecutive_failed_rounds (0 never aborts)."
            )

    def _load_global(self, params: torch.Tensor, buffers: torch.Tensor | None) -> None:
        self.space.load_(params)
        if self.buffer_space is not None and buffers is not None:
            self.buffer_space.load_(buffers)

    def evaluate(self, params: torch.Tensor | None = None, dataset=None, buffers=None) -> dict[str, float]:
        """Metrics of the global model (``params``, default: the current weights) on ``dataset``."""
        if params is not None:
            self._load_global(params, buffers)
        dataset = dataset if dataset is not None else self.eval_dataset
        if dataset is None:
            return {}
        metrics = self.client_trainer.evaluate(eval_dataset=dataset, metric_key_prefix="eval")
        return {k: float(v) for k, v in metrics.items()
                if k.startswith("eval_") and not k.endswith(("_runtime", "_samples_per_second", "_steps_per_second"))}

    # ---------------------------------------------------------------------------------------------
    def train(self, resume_from_checkpoint: str | bool | None = None) -> FederatedTrainOutput:
        """Run ``args.num_rounds`` rounds (from a checkpoint if asked) and save the final model.

        The loop is the same for every mode; what a round sends, where a client starts from and what
        happens to the updates are the hooks ``_start``, ``_round_clients``, ``_round_inputs``,
        ``_client_start``, ``_apply_round``, ``_checkpoint_state`` and ``_final_weights`` (the
        decentralized trainer overrides them: gossip instead of a server step).
        """
        # model-sized vectors (weights, updates, directions) reuse their memory from client to client
        with vectors.recycle_vectors(self.space.numel, self.space.dtype, self.space.device):
            return self._train(resume_from_checkpoint)

    def _train(self, resume_from_checkpoint) -> FederatedTrainOutput:
        args, comm = self.args, self.comm
        resume = resume_from_checkpoint if resume_from_checkpoint is not None else args.resume_from_checkpoint
        start_round, wall_offset = self._start(resume) if comm.is_main else (0, 0.0)
        if comm.is_main:
            self._write_partition()
        start_round = comm.broadcast_object(start_round)
        reporter = RoundReporter(args, self.model) if comm.is_main else None
        # rewritten every round: atomic, not fsynced (every checkpoint holds the history durably)
        history_file = RecordLog(os.path.join(args.output_dir, "history.json"))
        progress = tqdm(total=args.num_rounds, initial=start_round, desc="rounds", dynamic_ncols=True,
                        disable=not comm.is_main or args.disable_tqdm)
        run_start = time.perf_counter()
        for round_index in range(start_round, args.num_rounds):
            round_start = time.perf_counter()
            clients = self._round_clients(round_index)
            learning_rate = args.learning_rate * args.lr_decay_per_round**round_index
            self._call("on_round_begin", round_index, clients)

            shares = self._assign_to_processes(clients)
            inputs, payload_bytes = self._round_inputs(shares)
            updates, failures = [], {}
            for client_id in shares[comm.rank]:
                if args.round_deadline_seconds and time.perf_counter() - round_start > args.round_deadline_seconds:
                    failures[client_id] = f"straggler: round deadline of {args.round_deadline_seconds}s passed"
                    continue
                update, failure = self._train_client_safely(client_id, round_index, learning_rate,
                                                            *self._client_start(client_id, inputs))
                if failure is not None:
                    failures[client_id] = failure
                    continue
                updates.append(update)
                self._call("on_client_end", round_index, update)

            gathered = comm.gather_tensors(_encode_updates(updates, failures))
            if comm.is_main:
                updates, failures = _decode_gathered(gathered)
                del gathered  # the updates alone hold the exchange buffers (reused once they are dropped)
                self._observe_client_times(updates)
                self._check_failures(round_index, len(clients), updates, failures)
                record = self._apply_round(round_index, learning_rate, updates, payload_bytes)
                if failures:
                    record["failed_clients"] = [{"client": c, "reason": r} for c, r in sorted(failures.items())]
                record["round_seconds"] = time.perf_counter() - round_start
                record["wall_seconds"] = wall_offset + time.perf_counter() - run_start
                record.update(self.diagnostics.target_metrics(record))
                self.history.append(record)
                history_file.write(self.history)
                reporter.log(round_index + 1, {k: v for k, v in record.items() if k not in ("round", "clients")})
                progress.set_postfix({k: f"{record[k]:.4f}" for k in ("eval_accuracy", "train_loss") if k in record})
                if args.save_every_n_rounds and (round_index + 1) % args.save_every_n_rounds == 0:
                    self._save(round_index + 1, *self._checkpoint_state(), record["wall_seconds"])
                self._call("on_round_end", round_index, record)
            progress.update(1)
        progress.close()

        final_dir = None
        final = comm.broadcast_tensors(self._final_weights() if comm.is_main else None)
        params = final["params"]
        self._load_global(params, final.get("buffers"))
        if comm.is_main:
            reporter.close()
            self.diagnostics.finish(params)
            final_dir = self.save_model(os.path.join(args.output_dir, "final_model"))
            from ..hub import write_model_card_for_trainer

            write_model_card_for_trainer(self, final_dir)  # README.md (the model card), pushed or not
            self._call("on_train_end", self.history)
        comm.barrier()
        return FederatedTrainOutput(params=params, history=self.history, final_model_dir=final_dir)

    # --- the round's hooks (server mode) ------------------------------------------------------------
    def _start(self, resume) -> tuple[int, float]:
        """Main process: the initial (or restored) global model and server state; ``(start round, wall offset)``."""
        params = self.space.flatten().cpu()
        buffers = self.buffer_space.flatten().cpu() if self.buffer_space is not None else None
        server_state = self.algorithm.init_server_state(params)
        start_round, wall_offset = 0, 0.0
        if resume:
            params, buffers, server_state, start_round, wall_offset = self._restore(resume, params)
        self._global_params, self._global_buffers, self._server_state = params, buffers, server_state
        return start_round, wall_offset

    def _round_clients(self, round_index: int) -> list[int]:
        return sample_clients(self.args.num_clients, self.args.num_clients_per_round, self.args.seed, round_index)

    def local_work(self, client_id: int) -> tuple[int, int]:
        """``(optimizer steps, samples forwarded)`` of the client's local run (the Trainer's schedule)."""
        args = self.args
        return local_work(
            self.client_sizes[client_id], args.per_device_train_batch_size, local_steps=args.local_steps,
            local_epochs=args.local_epochs, gradient_accumulation_steps=args.gradient_accumulation_steps,
            drop_last=args.dataloader_drop_last,
        )

    def _assign_to_processes(self, clients: list[int]) -> list[list[int]]:
        """The round's clients per process, decided by the main process (it holds the measured times)."""
        comm = self.comm
        if not comm.distributed:
            return [list(clients)]
        shares = None
        if comm.is_main:
            costs = {c: self.cost_model.cost(*self.local_work(c)) for c in clients}
            shares = assign_to_processes(clients, costs, comm.world_size)
        return comm.broadcast_object(shares)

    def _observe_client_times(self, updates: list[ClientUpdate]) -> None:
        for update in updates:
            self.cost_model.observe(update.num_steps, self.local_work(update.client_id)[1], update.train_seconds)

    def _round_inputs(self, shares: list[list[int]]) -> tuple[dict, int]:
        """main -> all: ``w^t`` (and buffers) and what the pieces broadcast; main -> each process: the states
        of the clients it trains. Returns what this process received and the bytes a client downloads."""
        comm = self.comm
        payload = comm.broadcast_tensors(
            self._round_payload(self._global_params, self._global_buffers, self._server_state) if comm.is_main else None
        )
        payload_bytes = tensor_bytes(payload)
        payload.update(comm.scatter_tensors([self._client_states(share) for share in shares] if comm.is_main else None))
        global_params, global_buffers, broadcast, states = _split_payload(payload)
        return {"params": global_params, "buffers": global_buffers, "broadcast": broadcast, "states": states}, payload_bytes

    def _client_start(self, client_id: int, inputs: dict) -> tuple:
        """``(start params, broadcast, client state, start buffers)`` of a client (``train_client``'s arguments)."""
        return inputs["params"], inputs["broadcast"], inputs["states"].get(client_id, {}), inputs["buffers"]

    def _apply_round(self, round_index: int, learning_rate: float, updates: list[ClientUpdate],
                     payload_bytes: int) -> dict[str, Any]:
        """Main process: aggregate (unless every client failed) and return the round's record."""
        weights = None
        if updates:
            self._global_params, self._global_buffers, self._server_state, weights = self._server_round(
                round_index, updates, self._global_params, self._global_buffers, self._server_state, learning_rate
            )
        return self._round_record(round_index, learning_rate, updates, weights, self._global_params,
                                  self._global_buffers, payload_bytes)

    def _checkpoint_state(self) -> tuple:
        """``(params, buffers, server state)`` a checkpoint holds besides the client states."""
        return self._global_params, self._global_buffers, self._server_state

    def _final_weights(self) -> dict[str, torch.Tensor]:
        final = {"params": self._global_params}
        if self._global_buffers is not None:
            final["buffers"] = self._global_buffers
        return final

    def _round_payload(self, params, buffers, server_state) -> dict[str, torch.Tensor]:
        payload = {"params": params}
        if buffers is not None:
            payload["buffers"] = buffers
        payload.update({f"broadcast/{k}": v for k, v in flatten_state(self.algorithm.broadcast(server_state)).items()})
        return payload

    def _client_states(self, client_ids: list[int]) -> dict[str, torch.Tensor]:
        return {f"client/{client_id}/{k}": v for client_id in client_ids
                for k, v in flatten_state(self.store.get(client_id)).items()}

    def _server_round(self, round_index, updates, params, buffers, server_state, learning_rate):
        """Main process: aggregate, update the server halves and the client-state store."""
        weights = self._aggregation_weights(updates)
        params, server_state = self.algorithm.server_step(
            round_index, params, updates, weights, server_state, self.args.num_clients, learning_rate
        )
        if buffers is not None:  # running statistics: weighted mean, like FedAvg
            buffers = weighted_sum([u.buffers for u in updates], weights)
        for update in updates:
            if update.state:
                self.store.put(update.client_id, update.state)
        self._call("on_aggregate", round_index, updates)
        return params, buffers, server_state, weights

    def _round_record(self, round_index, learning_rate, updates, weights, params, buffers,
                      payload_bytes: int) -> dict[str, Any]:
        args = self.args
        record = {
            "round": round_index + 1,
            "num_clients": len(updates),
            "clients": [u.client_id for u in updates],
            "learning_rate": learning_rate,
        }
        if updates:  # else every client failed: the global model stayed as it was
            record["train_loss"] = float(sum(w * u.train_loss for w, u in zip(weights.tolist(), updates)))
            record["local_steps"] = float(np.mean([u.num_steps for u in updates]))
            record.update(self.diagnostics.round_metrics(updates, weights, payload_bytes))
        is_last = round_index + 1 == args.num_rounds
        if (round_index + 1) % args.eval_every_n_rounds == 0 or is_last:
            if self.eval_dataset is not None:
                record.update(self.evaluate(params, buffers=buffers))
            record.update(self.diagnostics.eval_metrics(params, buffers, record))
        return record

    # ---------------------------------------------------------------------------------------------
    def save_model(self, directory: str) -> str:
        """Save the current (global) model: ``save_pretrained`` when the model has it, else safetensors."""
        os.makedirs(directory, exist_ok=True)
        from ..models.lora import is_peft_model, save_federated_model

        if is_peft_model(self.model):
            save_federated_model(self.model, directory, lora_save=self.lora_save)
        elif hasattr(self.model, "save_pretrained"):
            self.model.save_pretrained(directory)
        else:
            atomic_save_safetensors({k: v.contiguous() for k, v in self.model.state_dict().items()},
                                    os.path.join(directory, "model.safetensors"))
        atomic_write_json(
            {"algorithm": self.algorithm.describe(), "num_clients": self.args.num_clients,
             "clients_per_round": self.args.num_clients_per_round, "num_rounds": self.args.num_rounds,
             "partition": {"scheme": self.partition.scheme, "description": self.partition.describe_scheme(),
                           "alpha": self.partition.alpha, "seed": self.partition.seed}},
            os.path.join(directory, "federated_config.json"),
        )
        return directory

    def _write_partition(self) -> None:
        """``partition.json`` (per-client indices and label counts) and ``partition_heatmap.png``."""
        from ..data import plot_partition_heatmap

        os.makedirs(self.args.output_dir, exist_ok=True)
        self.partition.save_json(os.path.join(self.args.output_dir, "partition.json"))
        plot_partition_heatmap(
            self.partition, os.path.join(self.args.output_dir, "partition_heatmap.png"),
            title=f"{self.partition.describe_scheme()}, {self.args.num_clients} clients",
        )

    def _save(self, round_number: int, params, buffers, server_state, wall_seconds: float) -> Path:
        meta = {"fingerprint": self._fingerprint(), "history": self.history, "wall_seconds": wall_seconds}
        tensors = self.space.named_tensors(params)
        if buffers is not None:
            tensors.update(self.buffer_space.named_tensors(buffers))
        return save_checkpoint(
            os.path.join(self.args.output_dir, "checkpoints"), round_number, tensors,
            server_state, self.store, meta, self.args.save_total_limit,
        )

    def _restore(self, spec, params):
        path = resolve_checkpoint(spec, os.path.join(self.args.output_dir, "checkpoints"))
        checkpoint = load_checkpoint(path)
        saved = checkpoint.meta.get("fingerprint", {})
        for name, value in self._fingerprint().items():
            if name in saved and saved[name] != value:
                raise CheckpointError(
                    f"{name}: the checkpoint {path} was made with {name}={saved[name]!r}, this run has {value!r}; "
                    "resume with the original settings or start a new output_dir."
                )
        names, shapes = list(self.space.names), list(self.space.shapes)
        if self.buffer_space is not None:
            names, shapes = names + self.buffer_space.names, shapes + self.buffer_space.shapes
        if set(checkpoint.params) != set(names) or any(checkpoint.params[n].shape != s for n, s in zip(names, shapes)):
            raise CheckpointError(f"Checkpoint {path} holds different parameters than this model.")
        restored = torch.cat([checkpoint.params[name].reshape(-1) for name in self.space.names]).to(params.dtype)
        buffers = None
        if self.buffer_space is not None:
            buffers = torch.cat([checkpoint.params[n].reshape(-1).float() for n in self.buffer_space.names])
        self.store.import_from(checkpoint.client_states_dir)
        self.history = list(checkpoint.meta.get("history", []))
        logger.info("Resuming from %s (round %d)", path, checkpoint.round)
        wall_seconds = float(checkpoint.meta.get("wall_seconds", 0.0))
        return restored, buffers, checkpoint.server_state, checkpoint.round, wall_seconds


def _split_payload(payload: dict[str, torch.Tensor]):
    """``(params, buffers or None, broadcast per piece, {client id: state})``."""
    broadcast, states = {}, {}
    for key, tensor in payload.items():
        if key.startswith("broadcast/"):
            broadcast[key.removeprefix("broadcast/")] = tensor
        elif key.startswith("client/"):
            _, client_id, rest = key.split("/", 2)
            states.setdefault(int(client_id), {})[rest] = tensor
    states = {cid: unflatten_state(state) for cid, state in states.items()}
    return payload["params"], payload.get("buffers"), unflatten_state(broadcast), states


def _encode_updates(updates: list[ClientUpdate], failures: dict[int, str]) -> dict[str, torch.Tensor]:
    out = {f"failed/{client_id}": torch.tensor(list(reason.encode()), dtype=torch.uint8)
           for client_id, reason in failures.items()}
    for i, u in enumerate(updates):
        out[f"{i}/meta"] = torch.tensor([u.client_id, u.num_samples, u.num_steps], dtype=torch.int64)
        out[f"{i}/scalars"] = torch.tensor([u.train_loss, u.train_seconds], dtype=torch.float64)
        out[f"{i}/delta"] = u.delta
        if u.buffers is not None:
            out[f"{i}/buffers"] = u.buffers
        out.update({f"{i}/msg/{k}": v for k, v in flatten_state(u.messages).items()})
        out.update({f"{i}/state/{k}": v for k, v in flatten_state(u.state).items()})
    return out


def _decode_gathered(gathered: list[dict[str, torch.Tensor]]) -> tuple[list[ClientUpdate], dict[int, str]]:
    """All processes' updates in client order, and the failures ``{client id: reason}``."""
    updates, failures = [], {}
    for part in gathered:
        for key in [k for k in part if k.startswith("failed/")]:
            failures[int(key.removeprefix("failed/"))] = bytes(part.pop(key).tolist()).decode()
        updates.extend(_decode_updates(part))
    return sorted(updates, key=lambda u: u.client_id), failures


def _decode_updates(tensors: dict[str, torch.Tensor]) -> list[ClientUpdate]:
    grouped: dict[int, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        index, rest = key.split("/", 1)
        grouped.setdefault(int(index), {})[rest] = tensor
    updates = []
    for index in sorted(grouped):
        part = grouped[index]
        client_id, num_samples, num_steps = (int(x) for x in part["meta"].tolist())
        messages = {k.removeprefix("msg/"): v for k, v in part.items() if k.startswith("msg/")}
        state = {k.removeprefix("state/"): v for k, v in part.items() if k.startswith("state/")}
        updates.append(ClientUpdate(
            client_id=client_id, num_samples=num_samples, num_steps=num_steps, train_loss=float(part["scalars"][0]),
            train_seconds=float(part["scalars"][1]),
            delta=part["delta"], messages=unflatten_state(messages), state=unflatten_state(state),
            buffers=part.get("buffers"),
        ))
    return updates


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
