"""The local ``Trainer``'s fast path: :class:`FastClientTrainer`, the reference ``ClientTrainer`` with the speed
mechanisms the switch (:mod:`.switch`) has on, and :func:`client_trainer_class`, which of the two a run builds.

Bit-identical weights and losses to the reference either way (tested). What is reused between clients: the prepared
optimizer (state cleared) and the step's preallocated vectors. Each client runs the lean client loop
(:mod:`.client_loop`) where it does all the Trainer's loop would, else the Trainer's own loop.

This relies on private ``transformers`` / ``accelerate`` API (``Trainer._prepare_for_training``,
``accelerator._models`` / ``_optimizers``, accelerate's module-level package lookups): pyproject pins both
libraries to the tested minor series. Each function checks that the configuration is one it reproduces
exactly and otherwise leaves the work to the Trainer.

Measured and removed (under 3% of a round, ``benchmarks/ablate.py``): a per-client cache of prepared dataloaders
and skipping the Trainer's FLOP count on their own. The lean client loop (with torch's clipping) came back as
:mod:`.client_loop`, where workload 6 (``benchmarks/user_data.py``: a 4.9k-parameter CNN, ~1.6 steps per client)
showed it pays.
"""

from __future__ import annotations

import functools
import random
from typing import Any, Callable

import numpy as np
import torch
from transformers import Trainer, set_seed
from transformers.trainer_utils import SchedulerType

from ..training.client_trainer import ClientTrainer
from ..training.step import StepResult
from . import client_loop, eval_loop, fast_step, switch
from .eval_data import EvalDataCache, eval_dataloader, single_process_gather
from .materialize import Materialized, materialize, skip_missing_video_reader, wrap_collator
from .memory import HeapTrimmer
from .transform_rows import TransformedEvalLoaders, TransformedSource, transformed_source

#: the mechanisms :class:`FastClientTrainer` applies (with all of them off a run builds the plain ``ClientTrainer``)
TRAINER_MECHANISMS = ("optimizer_reuse", "step_buffers", "free_memory", "cached_lookups", "seed_shortcut",
                      "heap_trim", "client_loop", "materialize", "transform_batches", "eval_rows", "eval_loop")


def client_trainer_class() -> type[ClientTrainer]:
    """The local Trainer class a run builds: :class:`FastClientTrainer` when the switch has any of its mechanisms on
    in this thread, else the reference ``ClientTrainer``."""
    return FastClientTrainer if any(switch.enabled(m) for m in TRAINER_MECHANISMS) else ClientTrainer


def mechanisms_of(trainer) -> switch.FastPath:
    """The speed mechanisms a local trainer applies: a :class:`FastClientTrainer`'s as the switch was when it was
    built; none for the reference ``ClientTrainer``."""
    return trainer.fast_path if isinstance(trainer, FastClientTrainer) else switch.OFF


def materialized_training_data(trainer, dataset) -> Materialized | TransformedSource | None:
    """What makes ``trainer``'s client datasets (``.rows(indices)``) instead of a ``select`` per client: ``dataset``
    read once into tensors (mechanism ``materialize``), or, for a dataset with a transform, its rows read a batch at
    a time (mechanism ``transform_batches``); the collator wrapped for them. None where neither applies."""
    fast_path = mechanisms_of(trainer)
    source = materialize(trainer, dataset) if fast_path("materialize") else None
    if source is None and fast_path("transform_batches"):
        source = transformed_source(trainer, dataset)
    if source is None:
        if fast_path("materialize"):
            skip_missing_video_reader()  # the datasets path formats every value: one probe, not one per value
        return None
    trainer.data_collator = wrap_collator(trainer.data_collator)
    return source


class FastClientTrainer(ClientTrainer):
    """``ClientTrainer`` with the fast path: each override below applies its mechanism when the switch had it on
    when the trainer was built (``self.fast_path``), and leaves the work to ``ClientTrainer`` otherwise."""

    #: workspace vectors whose views are kept (a piece splitting per-step temporaries must not grow it)
    MAX_WORKSPACE_VIEWS = 16

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        #: which speed mechanisms this trainer uses (the switch as it was when the trainer was built)
        self.fast_path: switch.FastPath = switch.current()
        if self.fast_path("free_memory") and not self.is_deepspeed_enabled:
            self.accelerator.free_memory = release_previous_client(self.accelerator)
        if self.fast_path("cached_lookups"):
            cache_accelerate_package_lookups()
        #: micro-batches that took the step's in-place path (see hf_fedflat.runtime.fast_step)
        self.in_place_steps = 0
        self._uniform_lr = False  # every param group of the optimizer follows args.learning_rate
        self._step_vectors: dict[str, tuple[torch.Tensor, list[torch.Tensor]]] = {}
        #: per-parameter views of the client's workspace vectors, made on first use (see :meth:`_workspace_views`)
        self._views_of_workspace: dict[int, tuple[torch.Tensor, list[torch.Tensor]]] = {}
        #: clients trained by the lean client loop (``runtime.client_loop``) instead of the Trainer's loop
        self.lean_loop_clients = 0
        #: the micro-batch's forward and backward pass while the lean client loop runs a client (its own)
        self.lean_forward_backward: Callable | None = None
        #: returns the heap memory of finished clients to the OS (call :meth:`release_memory` between clients)
        self.heap = HeapTrimmer()
        #: evaluation sets read once (mechanism ``eval_rows``, :mod:`.eval_data`)
        self.eval_data = EvalDataCache()
        #: evaluation dataloaders over datasets with a random transform (mechanism ``transform_batches``)
        self.transformed_eval_loaders = TransformedEvalLoaders()

    @property
    def keeps_step_buffers(self) -> bool:
        """The step keeps its flat vectors and corrects ``p.grad`` in place (mechanism ``step_buffers``)."""
        return self.fast_path("step_buffers")

    def start_client(self, train_dataset, *, learning_rate: float, **work: Any) -> None:
        kept = self.fast_path("optimizer_reuse") and reset_optimizer(self, learning_rate, self._uniform_lr)
        optimizer = self.optimizer
        super().start_client(train_dataset, learning_rate=learning_rate, **work)
        if kept:
            self.optimizer = optimizer
        self._views_of_workspace.clear()

    def release_memory(self) -> bool:
        """Between clients: give freed heap memory back to the OS if it piled up (see ``HeapTrimmer``)."""
        return self.fast_path("heap_trim") and self.heap.maybe_trim()

    def seed_for_client(self, seed: int) -> None:
        """``transformers.set_seed(seed)`` (on a CPU without its CUDA seeding call, see :func:`seed_cpu_generators`)."""
        seed_generators(self.args.device, seed, self.fast_path("seed_shortcut"))

    # -- Trainer overrides: the fast path where it applies ------------------------------------------
    def create_optimizer(self, model=None):
        created = self.optimizer is None
        optimizer = super().create_optimizer(model)
        if created:  # reused only when every group follows args.learning_rate (no per-group rates)
            self._uniform_lr = {g["lr"] for g in getattr(optimizer, "param_groups", [])} == {self.args.learning_rate}
        return optimizer

    def _inner_training_loop(self, batch_size=None, args=None, resume_from_checkpoint=None, trial=None,
                             ignore_keys_for_eval=None):
        args = args if args is not None else self.args
        if self.fast_path("client_loop") and client_loop.applies(self, args, resume_from_checkpoint, trial):
            self.lean_loop_clients += 1
            return client_loop.run(self, args, constant_schedule=self._constant_schedule(args))
        return super()._inner_training_loop(batch_size=batch_size, args=args,
                                            resume_from_checkpoint=resume_from_checkpoint, trial=trial,
                                            ignore_keys_for_eval=ignore_keys_for_eval)

    def _constant_schedule(self, args) -> bool:
        """Whether the learning-rate schedule is transformers' constant one, built by this class's own preparation
        (which the lean client loop may then ask to build none, see ``_prepare_for_training``)."""
        return (args.lr_scheduler_type == SchedulerType.CONSTANT
                and type(self).create_scheduler is Trainer.create_scheduler
                and type(self)._prepare_for_training is FastClientTrainer._prepare_for_training)

    def _prepare_for_training(self, max_steps, train_dataloader, resume_from_checkpoint, schedule: bool = True):
        """The Trainer's, or for the reused optimizer :func:`prepare_reused`.

        ``schedule=False`` (the lean client loop, under a constant schedule): with the reused optimizer no scheduler
        is built. The constant schedule's scheduler would set every group's rate to the one it already has
        (``reset_optimizer`` set both), at creation and at every step: ~90 us per client and ~15 us per step on
        workload 6 (``benchmarks/user_data.py``), where a client trains ~1.6 steps of ~1.5 ms."""
        prepared = None
        if self.fast_path("optimizer_reuse"):
            prepared = prepare_reused(self, max_steps, train_dataloader, resume_from_checkpoint, schedule)
        if prepared is None:
            return super()._prepare_for_training(max_steps, train_dataloader, resume_from_checkpoint)
        return prepared

    # -- evaluation: every evaluation, prediction, diagnostic and full gradient reads through these --------------
    def get_eval_dataloader(self, eval_dataset=None):
        """The Trainer's, or its batches from the evaluation set read once (mechanism ``eval_rows``)."""
        dataset = (self.eval_dataset[eval_dataset] if isinstance(eval_dataset, str) and self.eval_dataset is not None
                   else eval_dataset if eval_dataset is not None else self.eval_dataset)
        loader = self._eval_rows_loader(dataset, "Evaluation")
        return loader if loader is not None else super().get_eval_dataloader(eval_dataset)

    def get_test_dataloader(self, test_dataset):
        """The Trainer's, or its batches from the test set read once (mechanism ``eval_rows``)."""
        loader = self._eval_rows_loader(test_dataset, "test")
        return loader if loader is not None else super().get_test_dataloader(test_dataset)

    def evaluation_loop(self, dataloader, description, prediction_loss_only=None, ignore_keys=None,
                        metric_key_prefix="eval"):
        """The lean evaluation loop over kept rows (mechanism ``eval_loop``, :mod:`.eval_loop`) where it applies; else
        the Trainer's, with the one-process gather (mechanism ``eval_rows``; see ``SingleProcessGather``), which the
        Trainer's loop sets back to the accelerator's when it ends."""
        if self.fast_path("eval_loop") and eval_loop.applies(self, dataloader):
            return eval_loop.run(self, dataloader, description, prediction_loss_only=prediction_loss_only,
                                 ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)
        gather = single_process_gather(self) if self.fast_path("eval_rows") else None
        if gather is not None:
            self.gather_function = gather
        return super().evaluation_loop(dataloader, description, prediction_loss_only=prediction_loss_only,
                                       ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)

    def _eval_rows_loader(self, dataset, description: str):
        """The evaluation set read once (mechanism ``eval_rows``), else, for a transform not declared deterministic,
        its batches read by one ``dataset[rows]`` each (mechanism ``transform_batches``); None: the Trainer's."""
        if dataset is None or isinstance(dataset, str):
            return None
        loader = eval_dataloader(self, dataset, self.eval_data, description) if self.fast_path("eval_rows") else None
        if loader is None and self.fast_path("transform_batches"):
            loader = self.transformed_eval_loaders.loader(self, dataset)
        return loader

    # -- the algorithm's step -------------------------------------------------------------------------
    def forward_backward(self, model, inputs, num_items_in_batch=None) -> torch.Tensor:
        if self.lean_forward_backward is not None:
            return self.lean_forward_backward(model, inputs, num_items_in_batch)
        return super().forward_backward(model, inputs, num_items_in_batch)

    def algorithm_step(self, backward, forward) -> StepResult:
        if not self.keeps_step_buffers:
            return super().algorithm_step(backward, forward)
        result = fast_step.training_step(self.space, self.algorithm, self.workspaces, backward,
                                         vectors=self._step_vector, views=self._workspace_views,
                                         bias_scale=self._bias_scale, forward=forward)
        self.in_place_steps += result.in_place
        return result

    def _step_vector(self, name: str) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """A preallocated flat vector and its per-parameter views, reused by every step."""
        entry = self._step_vectors.get(name)
        if entry is None:
            space = self.space
            vector = torch.empty(space.numel, dtype=space.dtype, device=space.device)
            entry = self._step_vectors[name] = (vector, space.split(vector))
        return entry

    def _workspace_views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """``space.split(flat)`` for a vector fixed for the client's round (a correction's shift, LESAM's offset),
        made once per client instead of every step (splitting cost ~0.1 ms a step, like the correction itself)."""
        entry = self._views_of_workspace.get(id(flat))  # (the entry holds flat: its id is not reused meanwhile)
        if entry is None:
            if len(self._views_of_workspace) >= self.MAX_WORKSPACE_VIEWS:
                self._views_of_workspace.clear()
            entry = self._views_of_workspace[id(flat)] = (flat, self.space.split(flat))
        return entry[1]


# -- the optimizer, reused between clients ------------------------------------------------------------
def reset_optimizer(trainer, learning_rate: float, uniform_lr: bool) -> bool:
    """Give the next client the prepared optimizer with its state cleared and the round's learning rate.

    Only for torch optimizers (whose whole per-run state is ``optimizer.state``) already prepared by
    accelerate, whose every param group follows ``args.learning_rate`` (``uniform_lr``). Returns False
    when it does not apply (the caller then drops the optimizer, and the Trainer makes a new one).
    """
    optimizer = trainer.optimizer
    inner = getattr(optimizer, "optimizer", optimizer)
    if not (
        optimizer is not None
        and getattr(optimizer, "_is_accelerate_prepared", False)
        and type(inner).__module__.startswith("torch.optim.")
        and uniform_lr
    ):
        return False
    inner.state.clear()  # torch optimizers create their per-parameter state lazily on the first step
    for group in inner.param_groups:
        # initial_lr is where the new scheduler starts (LambdaLR only sets it when it is missing)
        group["lr"] = group["initial_lr"] = learning_rate
    return True


def prepare_reused(trainer, max_steps: int, train_dataloader, resume_from_checkpoint, schedule: bool = True):
    """``Trainer._prepare_for_training`` for an already prepared model and reused optimizer, or None.

    For those, the Trainer's version only re-registers them with the accelerator (``accelerator.prepare``
    returns them unchanged) and builds the scheduler; that is all this does, without the checks of
    ``prepare`` (~0.3 ms per client). None (take the Trainer's path) for any other set-up (DeepSpeed,
    FSDP, a resume, a new optimizer).
    ``schedule=False``: no scheduler (``trainer.lr_scheduler`` None), for a caller that steps none.
    """
    accelerator = trainer.accelerator
    prepared = (
        resume_from_checkpoint is None
        and not (trainer.is_deepspeed_enabled or trainer.is_fsdp_enabled or trainer.is_fsdp_xla_enabled)
        and not trainer.is_distributed_loading_by_transformers
        and getattr(accelerator, "parallelism_config", None) is None
        and trainer.model_wrapped is trainer.model
        and getattr(trainer.model, "_is_accelerate_prepared", False)
        and getattr(trainer.optimizer, "_is_accelerate_prepared", False)
    )
    if not prepared:
        return None
    for registry, item in ((accelerator._models, trainer.model), (accelerator._optimizers, trainer.optimizer)):
        if item not in registry:
            registry.append(item)
    trainer.lr_scheduler = None
    trainer._created_lr_scheduler = False
    if schedule:
        trainer.create_scheduler(num_training_steps=max_steps)
    for attr in ("model", "optimizer", "lr_scheduler"):
        setattr(trainer.callback_handler, attr, getattr(trainer, attr))
    trainer.callback_handler.train_dataloader = train_dataloader
    return trainer.model, train_dataloader


# -- seeding ----------------------------------------------------------------------------------------
def seed_cpu_generators(device: torch.device, seed: int) -> bool:
    """Seed Python, NumPy and torch's CPU generator as ``transformers.set_seed`` does; False (nothing done)
    where the CUDA generators matter (a GPU device, or CUDA initialised).

    On a CPU run with a CUDA build of torch, ``torch.manual_seed`` also queues a CUDA seeding call
    together with a formatted stack trace for when CUDA initialises: ~0.5 ms per call, and the queue
    grows by several entries per client per round for the whole run. Training on the CPU only reads
    the CPU generators, so they are seeded directly (the same states ``set_seed`` gives them).
    """
    if device.type != "cpu" or torch.cuda.is_initialized():
        return False
    random.seed(seed)
    np.random.seed(seed)
    torch.default_generator.manual_seed(seed)
    return True


def seed_generators(device: torch.device, value: int, shortcut: bool) -> None:
    """``transformers.set_seed(value)``, through :func:`seed_cpu_generators` when ``shortcut`` allows."""
    if not (shortcut and seed_cpu_generators(device, value)):
        set_seed(value)


# -- accelerate -------------------------------------------------------------------------------------
def release_previous_client(accelerator):
    """A replacement for ``accelerator.free_memory``: drops the accelerator's references to the previous
    client's optimizer, scheduler, model and dataloader, without its ``gc.collect()``.

    ``Trainer.train()`` starts with ``accelerator.free_memory()``, whose garbage collection costs ~0.6 s per
    client with the CUDA build of torch imported. Between clients reference counting frees what these
    lists held.
    """
    def free_memory(*objects):
        accelerator._schedulers, accelerator._optimizers, accelerator._models, accelerator._dataloaders = [], [], [], []
        accelerator.step = 0
        return objects[0] if len(objects) == 1 else objects

    return free_memory


_LOOKUPS_CACHED = False


def cache_accelerate_package_lookups() -> None:
    """Cache accelerate's ``is_lomo_available()`` and ``is_deepspeed_available()`` (for the whole process).

    ``AcceleratedOptimizer.step`` asks the first twice on every optimizer step, ``unwrap_model`` the
    second once per client, and each call searches ``sys.path`` (``importlib.util.find_spec`` plus
    package metadata, ~60 us here: 1-2% of a small model's step). Whether a package is installed cannot
    change while the process runs, so the answers are cached; the functions are otherwise the same.
    """
    global _LOOKUPS_CACHED
    if _LOOKUPS_CACHED:
        return
    import accelerate.accelerator
    import accelerate.optimizer
    import accelerate.utils.other

    for module in (accelerate.accelerator, accelerate.optimizer, accelerate.utils.other):
        for name in ("is_lomo_available", "is_deepspeed_available"):
            lookup = getattr(module, name, None)
            if lookup is not None and not hasattr(lookup, "cache_info"):
                setattr(module, name, functools.lru_cache(maxsize=None)(lookup))
    _LOOKUPS_CACHED = True
