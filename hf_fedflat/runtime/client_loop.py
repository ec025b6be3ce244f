"""The lean client loop (mechanism ``client_loop``): ``Trainer._inner_training_loop`` without what the federated
loop has turned off.

A client of a small model trains for one or two optimizer steps of ~1 ms; around them the Trainer's loop runs
callback events, logging and speed bookkeeping, a FLOP count per micro-batch (a walk over the model), a
``model.train()`` per micro-batch, a prepared DataLoader per client, accelerate's clipping dispatch, and a
checkpoint-folder scan at the end: workload 6 (``benchmarks/user_data.py``: FedAvg on digits) ran at 1.9x a plain
PyTorch loop. This loop runs the same micro-batches (the same ``get_batch_samples`` grouping, loss normalisation
and sync flags), the same clipping, optimizer and scheduler steps, and stops at ``max_steps``; bit-identical
weights and losses (``tests/runtime/test_client_loop.py``). Its parts, each measured on that workload (README):

* :class:`TensorRowsLoader`: materialised client rows batched by one index, without a DataLoader per client
  (the same batches and random draws as the Trainer's; else the Trainer's own dataloader);
* :func:`direct_clipping`: torch's ``clip_grad_norm_`` where accelerate's reduces to it, without its grouping;
* :func:`direct_optimizer_step`: the torch optimizer's ``step`` where accelerate's wrapper reduces to it;
* :func:`lean_pass`: ``Trainer.training_step`` without its per-micro-batch checks and divisions by 1.

It is used only where :func:`applies` says the Trainer's loop would do nothing more; anything else (a callback
on the local Trainer, logging, DeepSpeed, FSDP, a resume, ...) takes the Trainer's loop.

Relies on private ``transformers`` / ``accelerate`` API (``set_initial_training_values``, ``get_batch_samples``,
``gradient_state._set_sync_gradients``, ``loss_is_scaled_for_ga``): pyproject pins both to the tested minor series.
"""

from __future__ import annotations

import contextlib
import functools
import os

import torch
from accelerate.optimizer import AcceleratedOptimizer
from accelerate.utils import DistributedType, is_lomo_available
from torch.utils._foreach_utils import _device_has_foreach_support
from transformers import PreTrainedModel, Trainer
from transformers.optimization import GreedyLR
from transformers.trainer_callback import DefaultFlowCallback, TrainerState
from transformers.trainer_utils import TrainOutput
from transformers.utils import is_sagemaker_mp_enabled

from .materialize import PreCollated, TensorRows, is_default_collator
from .transform_rows import TransformedRows

_TRAINER_GET_TRAIN_SAMPLER = Trainer._get_train_sampler
_TRAINER_GET_TRAIN_DATALOADER = Trainer.get_train_dataloader
_TRAINER_LOSS_CONTEXT = Trainer.compute_loss_context_manager
_TRAINER_PREPARE_INPUTS = (Trainer._prepare_inputs, Trainer._prepare_input)
_PLAIN_TRAIN_MODES = (torch.nn.Module.train, PreTrainedModel.train)
# SageMaker's model parallelism is announced by the process's environment at launch: read it once, not per client
_sagemaker_mp_enabled = functools.cache(is_sagemaker_mp_enabled)
_lomo_available = functools.cache(is_lomo_available)  # (a search of sys.path per call)


def applies(trainer, args, resume_from_checkpoint=None, trial=None) -> bool:
    """Whether :func:`run` does everything the Trainer's loop would for this configuration.

    Needs: no resume or trial; only the Trainer's default flow callback (the federated loop removes the
    printer and progress bars, ``report_to="none"``); no saving, evaluation, logging or NaN filtering; one
    device, no DeepSpeed/FSDP/SageMaker/parallelism config; no NEFTune, LOMO, auto batch size, cache emptying
    or token counting; the model unwrapped (what ``_wrap_model`` returns on one device).
    """
    return (
        resume_from_checkpoint is None
        and trial is None
        and all(type(cb) is DefaultFlowCallback for cb in trainer.callback_handler.callbacks)
        and args.save_strategy == "no" and args.eval_strategy == "no" and args.logging_strategy == "no"
        and not (args.logging_nan_inf_filter or args.auto_find_batch_size or args.torch_empty_cache_steps)
        and not (args.eval_on_start or args.logging_first_step)
        and args.include_num_input_tokens_seen in (False, "no", None)
        and args.n_gpu <= 1
        and trainer.accelerator.distributed_type == DistributedType.NO  # (a federated process: see federation.comm)
        and not (trainer.is_deepspeed_enabled or trainer.is_fsdp_enabled or trainer.is_fsdp_xla_enabled)
        and not trainer.is_distributed_loading_by_transformers
        and getattr(trainer.accelerator, "parallelism_config", None) is None
        and not _sagemaker_mp_enabled()
        and trainer.neftune_noise_alpha is None
        and "lomo" not in str(args.optim)
        and trainer.model_wrapped is trainer.model
    )


class TensorRowsLoader:
    """The batches the Trainer's prepared training dataloader yields for materialised client rows
    (:class:`~hf_fedflat.runtime.materialize.TensorRows`), without building one per client.

    That dataloader (accelerate's ``DataLoaderShard`` over torch's ``DataLoader`` with accelerate's
    ``SeedableRandomSampler``, one process: the federated processes hide the launcher from accelerate)
    shuffles epoch ``e`` with ``torch.randperm(n)`` from a generator seeded ``initial_seed + e``, where
    ``initial_seed`` is torch's seed when it was built (here: when first iterated, see ``__iter__``); each new
    iterator draws one int64 from torch's global generator (the ``DataLoader``'s base seed for workers); batches
    are consecutive slices of the order (the last one partial unless ``drop_last``), collated by the materialised
    columns and moved to the device.
    This does the same (the batches and the global generator's state after each epoch are tested equal to the
    Trainer's dataloader, ``tests/runtime/test_client_loop.py``).

    On a device other than the CPU (``stage_on_device``) the client's rows and each epoch's order are copied to
    the device once, and every batch is indexed there: a host-to-device copy from pageable memory blocks the
    host until the device has caught up, so one per batch would be a sync per step; the batches are the same.
    """

    def __init__(self, rows, batch_size: int, drop_last: bool, device: torch.device,
                 stage_on_device: bool | None = None):
        self.dataset, self.batch_size, self.drop_last, self.device = rows, batch_size, drop_last, device
        #: rows of a transformed dataset (``runtime.transform_rows``): read one batch ahead, never staged
        self.transformed = type(rows) is TransformedRows
        staged = device.type != "cpu" if stage_on_device is None else stage_on_device
        self.stage_on_device = staged and not self.transformed
        #: torch's seed, read when first iterated (see __iter__)
        self.initial_seed: int | None = None
        self.epoch = 0
        self._staged: dict[str, torch.Tensor] | None = None

    def __len__(self) -> int:
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        # The seed is read with the first batch, not when the loader is built: in a lane of concurrent clients
        # (runtime.lanes) only the batch fetch runs under the generator guard, so at build time the generators
        # may hold another lane's states. One client at a time, nothing reseeds in between: the same seed.
        if self.initial_seed is None:
            self.initial_seed = torch.random.initial_seed()
        torch.empty((), dtype=torch.int64).random_()  # the DataLoader iterator's base seed, drawn as it draws it
        generator = torch.Generator()
        generator.manual_seed(self.initial_seed + self.epoch)
        order = torch.randperm(len(self.dataset), generator=generator)
        stops = range(0, len(self) * self.batch_size, self.batch_size)
        if self.transformed:
            yield from self._read_ahead(order, stops)
            return
        rows, materialized, device = self.dataset.indices, self.dataset.materialized, self.device
        if self.stage_on_device:
            if self._staged is None:  # the client's rows, collated and copied once for all its epochs
                self._staged = {k: v.to(device) for k, v in materialized.collate(rows).items()}
            order = order.to(device)
            for start in stops:
                index = order[start:start + self.batch_size]
                yield {k: v.index_select(0, index) for k, v in self._staged.items()}
            return
        for start in stops:
            batch = materialized.collate(rows[order[start:start + self.batch_size]])
            yield batch if device.type == "cpu" else {k: v.to(device) for k, v in batch.items()}

    def _read_ahead(self, order: torch.Tensor, stops: range):
        """A transformed dataset's batches, each read before the previous one is yielded, as accelerate's
        ``DataLoaderShard`` reads them (a transform drawing random numbers draws them in the same order)."""
        from accelerate.utils import send_to_device

        read = lambda start: self.dataset.batch(order[start:start + self.batch_size])  # noqa: E731
        on_cpu = self.device.type == "cpu"
        current = None
        for start in stops:
            following = read(start)
            if current is not None:
                yield current
            current = following if on_cpu else send_to_device(following, self.device)
        if current is not None:
            yield current


def tensor_rows_loader(trainer, args) -> TensorRowsLoader | None:
    """A :class:`TensorRowsLoader` for the client's dataset, or None where the Trainer's dataloader would do
    anything else (another dataset or collator, a sampler other than random, workers, one process only)."""
    dataset = trainer.train_dataset
    if not (
        type(dataset) in (TensorRows, TransformedRows) and len(dataset) > 0
        and isinstance(trainer.data_collator, PreCollated) and is_default_collator(trainer.data_collator)
        and trainer.accelerator.num_processes == 1
        and args.train_sampling_strategy == "random" and args.dataloader_num_workers == 0
        and type(trainer)._get_train_sampler is _TRAINER_GET_TRAIN_SAMPLER
        and type(trainer).get_train_dataloader is _TRAINER_GET_TRAIN_DATALOADER
        and args.data_seed is None and not args.accelerator_config.split_batches
        and not args.accelerator_config.dispatch_batches
    ):
        return None
    return TensorRowsLoader(dataset, trainer._train_batch_size, args.dataloader_drop_last, args.device)


def direct_clipping(trainer, parameters: list[torch.Tensor]):
    """``trainer._clip_grad_norm`` as torch's ``clip_grad_norm_`` on the model's parameter list, where accelerate's
    clipping reduces to exactly that (one process, no fp16 scaler, no FSDP, DeepSpeed, XLA or sharded gradients);
    else the Trainer's own method.

    Where every parameter has one device and dtype with torch's foreach kernels, this is ``clip_grad_norm_``'s own
    sequence of tensor operations (``_foreach_norm``, the norm of their stack, the clamped coefficient,
    ``_foreach_mul_``: the same values bit for bit, tested) without its per-call grouping of the gradients by
    device and dtype: inside workload 6's client loop (a 4.9k-parameter CNN, steps of ~1.5 ms) ~130 vs ~240
    us a step, ~4% of the round."""
    accelerator = trainer.accelerator
    if not (
        accelerator.distributed_type == DistributedType.NO
        and getattr(accelerator, "scaler", None) is None
        and os.environ.get("ACCELERATE_USE_FSDP", "false").lower() != "true"
    ):
        return trainer._clip_grad_norm
    max_norm = float(trainer.args.max_grad_norm)
    cached = getattr(trainer, "_lean_loop_clip", None)  # (the same parameter list every client: _model_lists)
    if cached is not None and cached[0] is parameters and cached[1] == max_norm:
        return cached[2]
    if any(type(p) is not torch.nn.Parameter and type(p) is not torch.Tensor for p in parameters):
        return trainer._clip_grad_norm  # e.g. DTensor parameters (sharded): accelerate groups them by mesh
    clip = _foreach_clipping(parameters, max_norm)
    trainer._lean_loop_clip = (parameters, max_norm, clip)
    return clip


def _foreach_clipping(parameters: list[torch.Tensor], max_norm: float):
    """``clip_grad_norm_(parameters, max_norm)``: its foreach operations without its grouping where every parameter
    has one device and dtype with foreach kernels (and the step's gradients are plain tensors), else the function."""
    groups = {(p.device, p.dtype) for p in parameters}

    def torch_clip(model):
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm)

    if len(groups) != 1 or not _device_has_foreach_support(next(iter(groups))[0]):
        return torch_clip

    def clip(model):
        grads = [p.grad for p in parameters if p.grad is not None]
        if not grads or any(type(g) is not torch.Tensor for g in grads):  # (torch's foreach test is on the grads)
            return torch_clip(model)
        with torch.no_grad():
            total_norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0)
            torch._foreach_mul_(grads, torch.clamp(max_norm / (total_norm + 1e-6), max=1.0))
        return total_norm

    return clip


def direct_optimizer_step(optimizer):
    """``optimizer.step`` past accelerate's ``AcceleratedOptimizer.step`` where that wrapper reduces to the torch
    optimizer's ``step``: no gradient scaler, no XLA, not a LOMO optimizer (and the lean loop steps only on synchronised
    gradients). Else ``optimizer.step`` itself. Saves the wrapper's checks, ~30 Python calls a step.

    A learning-rate scheduler built on the wrapper patched its ``step`` to flag that the optimizer stepped (torch warns
    at the scheduler's first step otherwise); the direct step sets that flag too."""
    if not (type(optimizer) is AcceleratedOptimizer and optimizer.scaler is None
            and optimizer.accelerator_state.distributed_type != DistributedType.XLA):
        return optimizer.step
    inner = optimizer.optimizer
    if _lomo_available():
        from lomo_optim import AdaLomo, Lomo

        if isinstance(inner, (Lomo, AdaLomo)):
            return optimizer.step
    flags_step = hasattr(optimizer.step, "_wrapped_by_lr_sched")

    def step():
        if flags_step:
            optimizer._opt_called = True
        return inner.step()

    return step


def lean_pass(trainer, args, inputs_on_device: bool = False):
    """``Trainer.training_step`` without its per-micro-batch checks that cannot change within a client's loop (for a
    configuration :func:`applies` accepted), or None where they matter (a schedule-free optimizer's mode switch).

    The same forward (the Trainer's ``_prepare_inputs``, autocast context and ``compute_loss``), the same loss
    normalisation and backward, without the divisions by 1 (one accumulation step: ``x / 1`` and its backward
    change no bit); ``model.train()``, which walks every module, is called once per client by :func:`run` and
    again only when the model is not in training mode. ``inputs_on_device``: the batches are flat dicts of tensors
    already on ``args.device`` (:class:`TensorRowsLoader`'s), for which the Trainer's ``_prepare_inputs`` (unless
    overridden) only copies the dict: so does this (a perturbed pass may reuse the batch after ``compute_loss``
    popped a key from its copy)."""
    prepare_inputs = trainer._prepare_inputs
    if inputs_on_device and (type(trainer)._prepare_inputs, type(trainer)._prepare_input) == _TRAINER_PREPARE_INPUTS:
        def prepare_inputs(inputs):
            return dict(inputs) if inputs else trainer._prepare_inputs(inputs)  # (an empty batch: its error)
    inner = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    if callable(getattr(inner, "train", None)):  # schedule-free optimizers: the Trainer switches them every step
        return None
    accelerator = trainer.accelerator
    # accelerate divides the loss by its own accumulation steps; a division by 1 (and its backward) changes no bit
    accelerate_divides = (accelerator.gradient_accumulation_steps != 1
                          or getattr(accelerator, "scaler", None) is not None)
    loss_scaled_for_ga = trainer.loss_is_scaled_for_ga
    # The Trainer's loss context is an empty ExitStack unless its autocast context is a real one
    context = (contextlib.nullcontext() if type(trainer).compute_loss_context_manager is
               _TRAINER_LOSS_CONTEXT and isinstance(trainer.autocast_smart_context_manager(), contextlib.nullcontext)
               else None)

    def forward_backward(model, inputs, num_items_in_batch=None):
        if not model.training:
            model.train()
        inputs = prepare_inputs(inputs)
        with context if context is not None else trainer.compute_loss_context_manager():
            loss = trainer.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
        del inputs
        scaled = loss_scaled_for_ga if loss_scaled_for_ga is not None else (
            (trainer.model_accepts_loss_kwargs and num_items_in_batch is not None)
            or trainer.compute_loss_func is not None)
        if not scaled and trainer.current_gradient_accumulation_steps != 1:
            loss = loss / trainer.current_gradient_accumulation_steps
        if accelerate_divides:
            accelerator.backward(loss)
        else:
            loss.backward()
        return loss.detach()

    return forward_backward


def _model_lists(trainer, model) -> tuple[list[torch.nn.Module], list[torch.nn.Parameter], bool]:
    """``(modules, parameters, plain_train_modes)`` of ``model``, listed at its first client and kept on the trainer.

    The federated run fixes the model's parameters when it starts (``ParameterSpace``), so these lists hold for all
    its clients; listing them walks the module tree (~140 Python calls for a 9-module CNN, per client).
    ``plain_train_modes``: no module overrides ``train`` (torch's or transformers' own only), so that ``model.train()``
    changes nothing when every module is in training mode; with an override (DoRA layers, timm's distillation
    tasks) ``model.train()`` is always called, as the Trainer does."""
    cached = getattr(trainer, "_lean_loop_model_lists", None)
    if cached is None or cached[0] is not model:
        modules = list(model.modules())
        plain = all(type(m).train in _PLAIN_TRAIN_MODES for m in modules)
        cached = trainer._lean_loop_model_lists = (model, modules, list(model.parameters()), plain)
    return cached[1], cached[2], cached[3]


def _set_grads_to_none(parameters) -> None:
    """``Module.zero_grad()`` (``set_to_none=True``) on a parameter list made once, without the module walk."""
    for p in parameters:
        if p.grad is not None:
            p.grad = None


def run(trainer, args, constant_schedule: bool = False) -> TrainOutput:
    """One client's local training, as ``Trainer._inner_training_loop`` with logging, saving, evaluation and
    callbacks off (see the module docstring). Returns ``TrainOutput(global_step, training_loss, metrics)``.

    ``constant_schedule``: the schedule is transformers' constant one and ``trainer._prepare_for_training`` takes
    ``schedule=False`` (``FastClientTrainer``'s): where it then builds no scheduler, none is stepped (the constant
    one sets each group's rate to the rate it has)."""
    trainer.accelerator.free_memory()
    train_dataloader = tensor_rows_loader(trainer, args) or trainer.get_train_dataloader()
    num_train_epochs, num_update_steps_per_epoch, _, _, _, steps_in_epoch, max_steps = (
        trainer.set_initial_training_values(args, train_dataloader)
    )
    trainer.state = state = TrainerState()
    state.train_batch_size = trainer._train_batch_size
    state.compute_steps(args, max_steps)
    scheduling = {"schedule": False} if constant_schedule else {}
    model, train_dataloader = trainer._prepare_for_training(max_steps, train_dataloader, None, **scheduling)
    trainer.model_wrapped = model
    accelerator, scheduler = trainer.accelerator, trainer.lr_scheduler
    optimizer_step = direct_optimizer_step(trainer.optimizer)
    accumulation, device = args.gradient_accumulation_steps, args.device
    modules, parameters, plain_train_modes = _model_lists(trainer, model)
    clip = direct_clipping(trainer, parameters) if args.max_grad_norm is not None and args.max_grad_norm > 0 else None
    total_loss = torch.zeros((), device=device)
    zero_grad = (functools.partial(_set_grads_to_none, parameters)
                 if type(model).zero_grad is torch.nn.Module.zero_grad else model.zero_grad)
    zero_grad()
    # (the Trainer's step calls model.train() every micro-batch, the lean pass when the mode changed; it walks every
    # module, and after the previous client each one is in training mode already, which this checks)
    if not plain_train_modes or False in [m.training for m in modules]:
        model.train()
    trainer.lean_forward_backward = lean_pass(trainer, args, inputs_on_device=isinstance(
        train_dataloader, TensorRowsLoader) and not train_dataloader.transformed)
    try:
        stop = False
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
                batch_samples, num_items_in_batch = trainer.get_batch_samples(epoch_iterator, num_batches, device)
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
                        if clip is not None:
                            clip(model)
                        optimizer_step()
                        if scheduler is not None and not accelerator.optimizer_step_was_skipped and not isinstance(
                                scheduler, (torch.optim.lr_scheduler.ReduceLROnPlateau, GreedyLR)):
                            scheduler.step()
                        zero_grad()
                        state.global_step += 1
                        state.epoch = epoch + (step + 1) / steps_in_epoch
                        if state.global_step >= max_steps:
                            stop = True
                            break
                if stop:
                    break
            if stop or step < 0:  # (step < 0: an empty epoch; the Trainer stops there too)
                break
    finally:
        trainer.lean_forward_backward = None  # (a client that raised must not leave it to the next, whichever loop)
    trainer.is_in_train = False
    train_loss = total_loss.item() / max(state.global_step, 0.001)
    metrics = {"train_loss": train_loss}
    trainer._memory_tracker.stop_and_update_metrics(metrics)  # (started by Trainer.train(); a no-op by default)
    return TrainOutput(state.global_step, train_loss, metrics)
