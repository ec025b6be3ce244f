"""``FederatedTrainer``: builds a run (data split, local Trainer, client-state store, strategy) and runs it.

The rounds themselves are :func:`hf_fedflat.federation.loop.run_rounds`; what a round does with the
clients' results is the trainer's :class:`~hf_fedflat.federation.strategy.Strategy` (server FL here,
gossip in :class:`~hf_fedflat.decentralized.DecentralizedTrainer`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
from typing import Any

import torch
from transformers import TrainingArguments

from ..algorithms import ClientUpdate, build_algorithm
from ..callbacks import FederatedCallback
from ..config import FedTrainingArguments
from ..diagnostics import RunDiagnostics
from ..hub.push import HubPushCallback, ModelCardCallback
from ..io import atomic_save_safetensors, atomic_write_json, atomic_write_text, disk_full_error
from ..metrics import accuracy_metrics
from ..runtime.fast_trainer import client_trainer_class
from ..state import create_client_state_store
from ..training import BufferSpace
from .checkpoint import RunCheckpoints
from .client import FailurePolicy, LocalTraining
from .comm import get_process_group, quiet_process_group_warning
from .divergence import DivergenceGuard
from .fingerprint import model_fingerprint, partition_fingerprint
from .load_balance import ClientCostModel
from .loop import LaunchProcesses, run_rounds
from .outcome import FederatedTrainOutput, TrainingFailedError, write_run_status
from .parent import watch_requested
from .reporting import PartitionFilesCallback
from .run_folder import abandon_run_folder, claim_run_folder, release_run_folder
from .start_summary import StartSummaryCallback
from .strategy import ServerStrategy
from .trainer_api import TrainerAPI, train_metrics

logger = logging.getLogger(__name__)

__all__ = ["FederatedTrainOutput", "FederatedTrainer", "accuracy_metrics", "local_training_arguments"]

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


class FederatedTrainer(TrainerAPI):
    """Runs a federated experiment with any registered algorithm.

    Shaped like ``transformers.Trainer`` (:mod:`.trainer_api`): ``train()`` returns ``metrics`` and
    ``training_loss``; ``evaluate``, ``predict``, ``state``, ``log_history``, ``add_callback``,
    ``save_model``, ``push_to_hub``, ``log_metrics``/``save_metrics``/``save_state``; a round is a step.

    Args:
        model: the model to federate (its trainable parameters are the federated state). Returns a
            ``loss`` when given ``labels``.
        args: the run's :class:`FedTrainingArguments`.
        train_dataset: the full training set; it is split into ``args.num_clients`` clients.
        eval_dataset: held-out data for the global model.
        partition: a precomputed :class:`~hf_fedflat.data.ClientPartition`; by default one is made from
            ``args`` (scheme, alpha, seed) on ``train_dataset``'s ``label_column``.
        label_column: column the partitioner reads labels from.
        data_collator, compute_metrics, processing_class, preprocess_logits_for_metrics: as for
            ``transformers.Trainer`` (``compute_metrics`` defaults to accuracy; a causal LM's are
            :mod:`hf_fedflat.metrics.language_modeling`).
        callbacks: :class:`FederatedCallback` or ``transformers.TrainerCallback`` instances (after the run's
            own: the partition files at the start, the model card at the end; a
            :class:`~hf_fedflat.hub.HubPushCallback` last with ``push_to_hub``, whose repository is created or
            reached here, before any round: :class:`~hf_fedflat.hub.push.HubAccessError` when it cannot be).
        lora_save: for a LoRA (peft) model, save the final model ``"merged"`` into the base weights or as the
            ``"adapter"`` (+ head) only.
        drop_invalid_rows: rows whose labels or inputs do not fit the model (:mod:`hf_fedflat.data.input_checks`,
            checked here, before any round) are dropped and counted (``self.input_report``) instead of refused
            with an :class:`~hf_fedflat.data.input_checks.InvalidInputError`.
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
        preprocess_logits_for_metrics=None,
        callbacks: list[FederatedCallback] | None = None,
        lora_save: str = "merged",
        drop_invalid_rows: bool = False,
    ):
        self.args = args
        if args.unset_optimizer_fields and not args.model_defaults_applied:
            # a model built in Python: the optimizer and rate left unset follow it, as the CLI's do its name
            from ..models.arguments import model_follows_trainer_conventions

            args.apply_model_defaults(*model_follows_trainer_conventions(model))
        self.comm = get_process_group()
        self.algorithm = build_algorithm(args)
        from ..data.input_checks import validate_inputs  # labels and inputs against the model, once

        train_dataset, eval_dataset, partition, self.input_report = validate_inputs(
            model, train_dataset, eval_dataset, label_column=label_column, partition=partition,
            drop_invalid_rows=drop_invalid_rows)
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
        #: seconds per client predicted from earlier clients' times (main process; splits rounds across processes)
        self.cost_model = ClientCostModel()
        self._init_trainer_api()
        self.callbacks = [StartSummaryCallback(), PartitionFilesCallback(), ModelCardCallback()]
        for callback in callbacks or []:
            self.add_callback(callback)
        if args.push_to_hub and not any(isinstance(c, HubPushCallback) for c in self.callbacks):
            self.callbacks.append(HubPushCallback())
        self._check_hub_push()  # as Trainer does when built: no round runs for a push that cannot happen
        #: dataset name/id, base model, task: extra details for the model card (recipes and the CLI fill it)
        self.model_card_kwargs: dict[str, Any] = {}
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
        self.client_trainer = client_trainer_class()(
            model=model, args=local_training_arguments(args), data_collator=data_collator,
            compute_metrics=compute_metrics, processing_class=processing_class,
            preprocess_logits_for_metrics=preprocess_logits_for_metrics,
        )
        if self.algorithm.aggregator.capabilities.decentralized and not self.supports_decentralized:
            raise ValueError(
                f"aggregator: {self.algorithm.aggregator.name!r} is decentralized (gossip, no server); build the "
                "trainer with hf_fedflat.create_trainer(...) or DecentralizedTrainer(...)."
            )
        self.model = self.client_trainer.model
        self.space = self.client_trainer.space
        self.lora_save = lora_save
        self.buffer_space = BufferSpace(self.model) if args.batchnorm_buffers == "average" else None
        self.history: list[dict] = []
        #: greedy generations from fixed prompts at each evaluation, under ``generations`` in the history (a
        #: :class:`~hf_fedflat.metrics.generation.GenerationProbe`; None: off)
        self.eval_generation = None
        self.diagnostics = RunDiagnostics(args, train_dataset, partition.client_indices)
        self.local_training = LocalTraining(self.client_trainer, self.algorithm, args, partition, train_dataset,
                                            self.buffer_space, self.diagnostics)
        self.failure_policy = FailurePolicy(args.max_consecutive_failed_rounds)
        #: a round whose train loss is NaN/Inf or far above the initial one fails the run (federation.divergence)
        self.divergence = DivergenceGuard(getattr(args, "divergence_factor", None))
        #: whether the final model learned (:func:`~.outcome.learning_check`), set at the end of the run
        self.learning_check: dict | None = None
        #: the claimed output_dir (federation.run_folder): set by train()
        self.run_folder = None
        #: further values a resume must match, and those of them that are settings (hf-fedflat train: its data,
        #: model and LoRA arguments, see federation.fingerprint.experiment_fingerprint)
        self.experiment_fingerprint: dict[str, Any] = {}
        self.experiment_settings: tuple[str, ...] = ()
        self.store = None
        if self.comm.is_main:
            store_dir = args.client_state_dir or os.path.join(args.output_dir, "client_states")
            self.store = create_client_state_store(args.client_state_store, store_dir, args.client_state_memory_mb)
        #: what a round does with the clients' results (server FL; DecentralizedTrainer: gossip)
        self.strategy = ServerStrategy(self.algorithm, args, self.store, self.diagnostics)
        #: where a round's clients train (federation.loop): this launch's processes; a Flower deployment's
        #: ServerApp sets its SuperNodes instead (hf_fedflat.flower)
        self.round_clients = LaunchProcesses()

    @functools.cached_property
    def checkpoints(self) -> RunCheckpoints:
        """This run's checkpoints (made on first use). The fingerprint (:mod:`.fingerprint`) holds the model's
        class and parameter names/shapes/dtypes digest, the data's row count and partition digest, the strategy's
        settings and :attr:`experiment_fingerprint`."""
        # (the arguments the user gave first: a refusal names the first value that differs)
        extra = {**self.experiment_fingerprint, "num_parameters": self.space.numel, **model_fingerprint(self.model),
                 **partition_fingerprint(self.partition, self.train_dataset)}
        # Under LoRA a checkpoint holds adapters + head only: resuming is right only on the same frozen base.
        if any(not p.requires_grad for p in self.model.parameters()):
            from ..models.lora import frozen_parameter_digest

            extra["frozen_parameters_sha256"] = frozen_parameter_digest(self.model)
        extra.update(self.strategy.fingerprint)
        return RunCheckpoints(self.args, self.space, self.buffer_space, extra,
                              experiment_settings=self.experiment_settings)

    def call_callbacks(self, hook: str, *args, **kwargs) -> None:
        """Run ``hook`` of every callback, in order, with this trainer first."""
        for callback in self.callbacks:
            method = getattr(callback, hook, None)
            if method is not None:
                method(self, *args, **kwargs)

    # ---------------------------------------------------------------------------------------------
    def train_client(self, client_id: int, round_index: int, learning_rate: float, global_params: torch.Tensor,
                     broadcast: dict, state: dict, global_buffers: torch.Tensor | None = None) -> ClientUpdate:
        """Local training of one client from ``global_params``; returns its update (CPU tensors)."""
        return self.local_training.train(client_id, round_index, learning_rate, global_params, broadcast, state,
                                         global_buffers)

    def local_work(self, client_id: int) -> tuple[int, int]:
        """``(optimizer steps, samples forwarded)`` of the client's local run (the Trainer's schedule)."""
        return self.local_training.local_work(client_id)

    def load_weights(self, params: torch.Tensor, buffers: torch.Tensor | None = None) -> None:
        """Put ``params`` (and averaged ``buffers``) into the model."""
        self.local_training.load_weights(params, buffers)

    def train(self, resume_from_checkpoint: str | bool | None = None) -> FederatedTrainOutput:
        """Run ``args.num_rounds`` rounds (from a checkpoint if asked) and save the final model.

        Returns:
            :class:`~.loop.FederatedTrainOutput`: ``params``, ``history``, ``final_model_dir`` and
            ``transformers.TrainOutput``'s ``global_step`` (rounds done), ``training_loss`` and ``metrics``
            (:func:`~.trainer_api.train_metrics`; on the main process). A run that did not train raises
            :class:`~.outcome.TrainingFailedError`, whose ``output`` carries the same fields.
        """
        resume = resume_from_checkpoint if resume_from_checkpoint is not None else self.args.resume_from_checkpoint
        # the folder is this run's until it ends: locked, checked, run_status.json "running" (federation.run_folder)
        folder = self.run_folder = claim_run_folder(self.args, resume, self.comm)
        try:
            watch_requested()  # a bad HF_FEDFLAT_EXIT_WITH_PARENT: refused before round 1, the folder left as it was
            with _sigterm_as_exit():
                output = run_rounds(self, resume)
        except TrainingFailedError as failed:
            failed.output = self._with_train_metrics(failed.output)
            raise
        except BaseException as error:
            self._record_stop(folder, error)
            raise
        finally:
            release_run_folder(folder)
        return self._with_train_metrics(output)

    def _record_stop(self, folder, error: BaseException) -> None:
        """Main process: a run refused before its first round (bad input) leaves the folder's status as it was;
        one stopped later by an error or a signal is recorded as ``interrupted``, with the reason."""
        if not self.comm.is_main or not folder.is_holder:
            return
        if not folder.rounds_started and isinstance(error, ValueError):
            abandon_run_folder(folder)
            return
        if isinstance(error, _Terminated):
            reason = "SIGTERM: the process was asked to stop"
        else:
            reason = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        try:
            write_run_status(self.args.output_dir, self.history, "interrupted", reason, None, folder.status_fields())
        except Exception as failure:  # (a full disk, say): the original error is what matters
            logger.warning("Could not record the interruption in run_status.json: %s", failure)

    def _with_train_metrics(self, output: FederatedTrainOutput) -> FederatedTrainOutput:
        metrics = train_metrics(output.history)
        self._record_train_summary(metrics)
        return dataclasses.replace(output, global_step=int(metrics.get("train_rounds", 0)),
                                   training_loss=metrics.get("train_loss", float("nan")), metrics=metrics)

    # ---------------------------------------------------------------------------------------------
    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> str:
        """Save the current model (to ``output_dir``, default ``<args.output_dir>/final_model``; main process only,
        as ``Trainer``; returns the folder): ``save_pretrained`` when the model has it, else safetensors; the
        ``processing_class`` (tokenizer/processor) when it has ``save_pretrained``; and ``federated_config.json``
        (algorithm, clients, rounds, partition, the strategy's settings, rows dropped as invalid).

        The folder is written whole or not at all (:func:`hf_fedflat.io.atomic_write_dir`): into a temporary
        folder beside ``directory``, closed by ``hf_fedflat_complete.json`` (every file's size and SHA-256), then
        renamed into place (a previous ``directory`` is replaced). A symbolic link at ``directory`` or between
        ``output_dir`` and it is refused."""
        from ..io import atomic_write_dir

        directory = output_dir if output_dir is not None else os.path.join(self.args.output_dir, "final_model")
        if not self.comm.is_main:
            return directory
        atomic_write_dir(directory, self._write_model_files, root=self.args.output_dir)
        return directory

    def _write_model_files(self, directory: str) -> None:
        from ..models.lora import is_peft_model, save_federated_model

        weights = os.path.join(directory, "adapter_model.safetensors" if is_peft_model(self.model)
                               else "model.safetensors")
        try:
            if is_peft_model(self.model):
                save_federated_model(self.model, directory, lora_save=self.lora_save)
            elif hasattr(self.model, "save_pretrained"):
                self.model.save_pretrained(directory)
            else:
                atomic_save_safetensors({k: v.contiguous() for k, v in self.model.state_dict().items()}, weights)
        except Exception as error:  # a full disk: named as the weights file (safetensors' error names none)
            full = disk_full_error(error, weights)
            if full is None:
                raise
            raise full from error
        from ..models.artifacts import complete_model_folder  # tokenizer/processor saved; timm layout for timm models

        complete_model_folder(directory, processing_class=getattr(self.client_trainer, "processing_class", None),
                              data_config=getattr(self, "data_config", None))
        from .run_record import RUN_CONFIG_NAME, federated_config, run_config_yaml

        # what the run was: its set-up for readers and cards; with the command line's arguments, a config that reruns it
        atomic_write_json(federated_config(self), os.path.join(directory, "federated_config.json"))
        run_config = getattr(self, "run_config", None)
        if run_config:
            resolved = {name: getattr(self.args, name) for name in getattr(self.args, "_defaulted_fields", ())}
            atomic_write_text(run_config_yaml(run_config, resolved), os.path.join(directory, RUN_CONFIG_NAME))


class _Terminated(SystemExit):
    """SIGTERM during a run (a scheduler's preemption, a launcher stopping its processes): raised in the main
    thread, so that the run records ``interrupted`` before the process exits with status 143."""


@contextlib.contextmanager
def _sigterm_as_exit():
    """While a run trains, SIGTERM raises :class:`_Terminated` (main thread, and only when no handler is set)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def terminate(signum, frame):
        raise _Terminated(128 + signal.SIGTERM)

    signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
