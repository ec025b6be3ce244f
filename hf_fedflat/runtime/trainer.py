"""The local ``Trainer``'s fast path: what ``training.ClientTrainer`` does instead of the Trainer's own code
when the switch (:mod:`.switch`) has the mechanism on.

This relies on private ``transformers`` / ``accelerate`` API (``Trainer._prepare_for_training``,
``accelerator._models`` / ``_optimizers``, accelerate's module-level package lookups): pyproject pins both
libraries to the tested minor series. Each function checks that the configuration is one it reproduces
exactly and otherwise leaves the work to the Trainer (bit-identical weights and losses either way; tested).

Measured and removed (under 3% of a round, ``benchmarks/ablate.py``): a per-client cache of prepared dataloaders
and skipping the Trainer's FLOP count on their own. The lean client loop (with torch's clipping) came back as
:mod:`.client_loop`, where workload 6 of issue 20 (a 4.9k-parameter CNN, ~1.6 steps per client) showed it pays.
"""

from __future__ import annotations

import functools
import random

import numpy as np
import torch
from transformers import set_seed


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
