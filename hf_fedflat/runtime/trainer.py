"""The local ``Trainer``'s fast path: what ``training.ClientTrainer`` does instead of the Trainer's own code
when the switch (:mod:`.switch`) has the mechanism on.

Everything here relies on private ``transformers`` / ``accelerate`` API (``Trainer._inner_training_loop``,
``_prepare_for_training``, ``_clip_grad_norm``, ``accelerator._models``, ...): pyproject pins both libraries
to the tested minor series. Each function checks that the configuration is one it reproduces exactly and
otherwise leaves the work to the Trainer (bit-identical weights and losses either way; tested).
"""

from __future__ import annotations

import functools
import os
import random
from collections import OrderedDict
from typing import Any

import numpy as np
import torch
from accelerate.utils import DistributedType
from transformers import set_seed
from transformers.trainer_callback import DefaultFlowCallback, TrainerState
from transformers.trainer_utils import TrainOutput
from transformers.utils import is_sagemaker_mp_enabled

#: prepared training dataloaders kept for the next visit of the same client (least recently used dropped)
MAX_CACHED_DATALOADERS = 256


# -- the client's loop --------------------------------------------------------------------------------
def client_loop_applies(trainer, args, resume_from_checkpoint, trial) -> bool:
    """Whether :func:`client_loop` does everything the Trainer's loop would for this configuration.

    The federated loop turns off the local Trainer's logging, evaluation, saving and pushing; what its
    loop then still does per client beyond the steps (callback events, logging bookkeeping, speed and
    memory metrics, a checkpoint folder scan) costs ~1 ms, as much as a small model's local round
    spends in half its optimizer steps. Anything else (DeepSpeed, FSDP, callbacks, resume, LOMO, ...)
    takes the Trainer's own loop.
    """
    return (
        resume_from_checkpoint is None
        and trial is None
        and all(type(cb) is DefaultFlowCallback for cb in trainer.callback_handler.callbacks)
        and args.save_strategy == "no" and args.eval_strategy == "no" and args.logging_strategy == "no"
        and not (args.logging_nan_inf_filter or args.auto_find_batch_size or args.torch_empty_cache_steps)
        and not (args.eval_on_start or args.logging_first_step or args.include_num_input_tokens_seen not in (False, "no"))
        and args.n_gpu <= 1
        and not (trainer.is_deepspeed_enabled or trainer.is_fsdp_enabled or trainer.is_fsdp_xla_enabled)
        and not trainer.is_distributed_loading_by_transformers
        and getattr(trainer.accelerator, "parallelism_config", None) is None
        and trainer.neftune_noise_alpha is None
        and "lomo" not in str(args.optim)
    )


def client_loop(trainer, args) -> TrainOutput:
    """The Trainer's loop without what the federated loop has turned off: the same batches (in micro-batches
    of ``gradient_accumulation_steps``, the loss normalised as the Trainer does), the same clipping,
    optimizer and scheduler steps, stopping at ``max_steps``; bit-identical results (tested)."""
    trainer.accelerator.free_memory()
    train_dataloader = trainer.get_train_dataloader()
    num_train_epochs, num_update_steps_per_epoch, _, _, _, steps_in_epoch, max_steps = (
        trainer.set_initial_training_values(args, train_dataloader)
    )
    trainer.state = state = TrainerState()
    state.train_batch_size = trainer._train_batch_size
    state.compute_steps(args, max_steps)
    model, train_dataloader = trainer._prepare_for_training(max_steps, train_dataloader, None)
    accelerator = trainer.accelerator
    accumulation = args.gradient_accumulation_steps
    total_loss = torch.zeros((), device=args.device)
    model.zero_grad()
    for epoch in range(num_train_epochs):
        if hasattr(train_dataloader, "set_epoch"):
            train_dataloader.set_epoch(epoch)
        inner_sampler = getattr(getattr(train_dataloader, "batch_sampler", None), "batch_sampler", None)
        if hasattr(inner_sampler, "set_epoch"):
            inner_sampler.set_epoch(epoch)
        epoch_iterator = iter(train_dataloader)
        remainder = steps_in_epoch % accumulation or accumulation
        step = -1
        for update_step in range(num_update_steps_per_epoch):
            num_batches = accumulation if update_step != num_update_steps_per_epoch - 1 else remainder
            batch_samples, num_items_in_batch = trainer.get_batch_samples(epoch_iterator, num_batches, args.device)
            trainer.current_gradient_accumulation_steps = len(batch_samples)
            for index, inputs in enumerate(batch_samples):
                step += 1
                sync = (step + 1) % accumulation == 0 or step + 1 == steps_in_epoch
                accelerator.gradient_state._set_sync_gradients(sync)
                if index == len(batch_samples) - 1:
                    total_loss += trainer.training_step(model, inputs, num_items_in_batch)
                else:
                    with accelerator.no_sync(model=model):
                        total_loss += trainer.training_step(model, inputs, num_items_in_batch)
                if sync:
                    if args.max_grad_norm > 0:
                        trainer._clip_grad_norm(model)
                    trainer.optimizer.step()
                    if not accelerator.optimizer_step_was_skipped:
                        trainer.lr_scheduler.step()
                    model.zero_grad()
                    state.global_step += 1
                    state.epoch = epoch + (step + 1) / steps_in_epoch
                    if state.global_step >= max_steps:
                        break
            if state.global_step >= max_steps:
                break
        if step < 0 or state.global_step >= max_steps:
            break
    trainer.is_in_train = False
    train_loss = total_loss.item() / max(state.global_step, 0.001)
    return TrainOutput(state.global_step, train_loss, {"train_loss": train_loss})


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


def prepare_reused(trainer, max_steps: int, train_dataloader, resume_from_checkpoint):
    """``Trainer._prepare_for_training`` for an already prepared model and reused optimizer, or None.

    For those, the Trainer's version only re-registers them with the accelerator (``accelerator.prepare``
    returns them unchanged) and builds the scheduler; that is all this does, without the checks of
    ``prepare`` (~0.3 ms per client). None (take the Trainer's path) for any other set-up (DeepSpeed,
    FSDP, a resume, a new optimizer).
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
    trainer.create_scheduler(num_training_steps=max_steps)
    for attr in ("model", "optimizer", "lr_scheduler"):
        setattr(trainer.callback_handler, attr, getattr(trainer, attr))
    trainer.callback_handler.train_dataloader = train_dataloader
    return trainer.model, train_dataloader


# -- clipping ---------------------------------------------------------------------------------------
class DirectClipping:
    """The Trainer's clipping where accelerate's ``clip_grad_norm_`` reduces to torch's: one process, no fp16
    grad scaler to unscale first, no FSDP, DeepSpeed or sharded (DTensor) gradients.

    accelerate then calls ``torch.nn.utils.clip_grad_norm_`` on ``list(model.parameters())``; this does the
    same on the same list, made once, without the per-step dispatch (the parameter walk, version and type
    checks) and, on a CPU, without multiplying the gradients by a clip coefficient of exactly 1: together
    ~0.2 ms of a ~5 ms step on the benchmark CNN. Bit-identical; :meth:`__call__` returns None where it
    does not apply (the caller takes the Trainer's path).
    """

    def __init__(self):
        self.parameters: tuple[Any, list[torch.Tensor]] | None = None  # (model, its parameters), made once

    def __call__(self, trainer, model) -> torch.Tensor | None:
        accelerator = trainer.accelerator
        if not (
            accelerator.distributed_type == DistributedType.NO
            and getattr(accelerator, "scaler", None) is None
            and not is_sagemaker_mp_enabled()
            and not (trainer.is_deepspeed_enabled or trainer.is_fsdp_enabled)
            and os.environ.get("ACCELERATE_USE_FSDP", "false").lower() != "true"
            and not trainer._has_mixed_mesh_grads(model)
        ):
            return None
        cached = self.parameters
        if cached is None or cached[0] is not model:
            cached = self.parameters = (model, list(model.parameters()))
        parameters, max_norm = cached[1], trainer.args.max_grad_norm
        # torch.nn.utils.clip_grad_norm_ in its two halves (the same calls), so that on a CPU the scaling
        # can be skipped when it is by exactly 1: torch multiplies anyway to spare accelerators a
        # device -> host sync, which a CPU tensor does not need (a pass over the gradients a step)
        total_norm = torch.nn.utils.get_total_norm([p.grad for p in parameters if p.grad is not None])
        if total_norm.device.type == "cpu" and bool(max_norm / (total_norm + 1e-6) >= 1.0):
            return total_norm
        torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, total_norm)
        return total_norm


# -- dataloaders, kept per client ---------------------------------------------------------------------
class DataloaderCache:
    """Each client's prepared training dataloader, rewound to the client's seed on its next visit.

    Only loaders with accelerate's seedable sampler are kept (their shuffle depends on that seed alone).
    An entry holds its dataset, so the dataset's id cannot be reused by another object meanwhile.
    """

    def __init__(self, max_entries: int = MAX_CACHED_DATALOADERS):
        self.max_entries = max_entries
        self._loaders: OrderedDict[int, tuple[Any, Any, tuple]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._loaders)

    def get(self, trainer, build):
        """The cached loader of ``trainer.train_dataset`` (rewound), or ``build()``'s (kept if seedable)."""
        dataset, args = trainer.train_dataset, trainer.args
        signature = (trainer._train_batch_size, args.dataloader_drop_last, args.dataloader_num_workers,
                     args.remove_unused_columns, id(trainer.data_collator))
        key = id(dataset)
        entry = self._loaders.get(key)
        if entry is not None and entry[0] is dataset and entry[2] == signature:
            loader = entry[1]
            _rewind(loader, _seedable_sampler(loader))
            self._loaders.move_to_end(key)
            return loader
        loader = build()
        if _seedable_sampler(loader) is not None:
            self._loaders[key] = (dataset, loader, signature)
            while len(self._loaders) > self.max_entries:
                self._loaders.popitem(last=False)
        return loader


def _seedable_sampler(loader):
    """accelerate's ``SeedableRandomSampler`` of a prepared dataloader, or None (another sampler)."""
    from accelerate.data_loader import SeedableRandomSampler

    for sampler in (getattr(getattr(loader, "batch_sampler", None), "sampler", None), getattr(loader, "sampler", None)):
        if isinstance(sampler, SeedableRandomSampler):
            return sampler
    return None


def _rewind(loader, sampler) -> None:
    """Put a prepared dataloader back in the state of a new one built now: epoch 0, shuffled from the
    current torch seed (a new ``SeedableRandomSampler`` reads ``torch.random.initial_seed()``)."""
    sampler.initial_seed = torch.random.initial_seed()
    sampler.set_epoch(0)
    if hasattr(loader, "iteration"):
        loader.iteration = 0


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


def seed(device: torch.device, value: int, shortcut: bool) -> None:
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
