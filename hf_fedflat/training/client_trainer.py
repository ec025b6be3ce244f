"""The local ``Trainer``: one per process, reused for every client it trains."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import random
from collections import OrderedDict
from typing import Any

import numpy as np
import torch
from accelerate.utils import DistributedType
from transformers import Trainer, set_seed
from transformers.utils import is_sagemaker_mp_enabled
from transformers.trainer_callback import DefaultFlowCallback, PrinterCallback, ProgressCallback, TrainerState
from transformers.trainer_utils import TrainOutput

from .. import vectors
from ..algorithms.composed import FederatedAlgorithm
from .parameters import ParameterSpace

#: prepared training dataloaders kept for the next visit of the same client (least recently used dropped)
MAX_CACHED_DATALOADERS = 256
#: growth of the resident set since the last heap trim that triggers the next one (see HeapTrimmer)
HEAP_TRIM_SLACK_BYTES = 128 * 2**20


class ClientTrainer(Trainer):
    """A ``transformers.Trainer`` whose step asks the client algorithm for the direction.

    Built once per process; :meth:`start_client` swaps in the next client's data, resets the optimizer
    (its state is dropped and the round's learning rate set, so every client starts like with a new
    optimizer) and sets the local work. The Trainer's own loop still does mixed precision, gradient
    accumulation, clipping (of the final direction), the optimizer and scheduler steps.

    The step: ``grad_at(offset)`` runs the Trainer's ordinary ``training_step`` (forward, loss scaled
    for accumulation, backward through the accelerator) at ``w + offset`` and restores ``w`` from a
    saved copy; the perturbation combines such passes into a direction, the corrections adjust it, and
    the result becomes ``p.grad`` (added to the gradients of earlier micro-batches of the same step).

    What is reused between clients (``reuse_between_clients=True``, the default; ``False`` rebuilds
    everything per client, the reference the tests compare against bit for bit):

    * the optimizer, prepared by accelerate once: a client gets it with its state cleared and the
      round's learning rate (torch optimizers only, whose whole per-run state is ``optimizer.state``);
    * each client's prepared training dataloader, rewound to the client's seed on the next visit
      (only loaders with accelerate's seedable sampler, whose shuffle depends on that seed alone);
    * the step's scratch vectors (the saved copy of ``w``, earlier micro-batches' gradients).

    Per client this saves about 1.5 ms of Trainer set-up on a CPU (optimizer construction, accelerate's
    wrapping of optimizer and dataloader); a tiny model's local round is ~10-20 ms.
    """

    def __init__(self, *args, reuse_between_clients: bool = True, **kwargs):
        super().__init__(*args, **kwargs)
        # Per-client logs would flood the console; the round loop reports instead.
        self.remove_callback(PrinterCallback)
        self.remove_callback(ProgressCallback)
        self.space = ParameterSpace(self.model)
        # Trainer.train() starts with accelerator.free_memory(), whose gc.collect() costs ~0.6 s per client
        # with the CUDA build of torch imported. Between clients only the accelerator's references to the
        # previous optimizer/dataloader need dropping; reference counting frees them.
        if not self.is_deepspeed_enabled:
            self.accelerator.free_memory = self._release_previous_client
        _cache_accelerate_package_lookups()
        self.reuse_between_clients = reuse_between_clients
        self.algorithm: FederatedAlgorithm | None = None
        self.workspaces: dict[str, Any] = {}
        #: forward+backward passes run so far (diagnostics and tests)
        self.gradient_passes = 0
        #: local rounds run by :meth:`_client_loop` (the others went through the Trainer's own loop)
        self.client_loops = 0
        #: corrected micro-batches that took :meth:`_corrected_step_in_place`
        self.in_place_steps = 0
        self._train_loaders: OrderedDict[int, tuple[Any, Any, tuple]] = OrderedDict()
        self._uniform_lr = False  # every param group of the optimizer follows args.learning_rate
        self._scratch_vectors: dict[str, tuple[torch.Tensor, list[torch.Tensor]]] = {}
        #: per-parameter views of the client's workspace vectors, made on first use (see :meth:`_workspace_views`)
        self._views_of_workspace: dict[int, tuple[torch.Tensor, list[torch.Tensor]]] = {}
        #: returns the heap memory of finished clients to the OS (call :meth:`release_memory` between clients)
        self.heap = HeapTrimmer()
        self._clip_parameters: tuple[Any, list[torch.Tensor]] | None = None  # (model, its parameters) for clipping

    def start_client(
        self,
        train_dataset,
        *,
        learning_rate: float,
        algorithm: FederatedAlgorithm,
        workspaces: dict[str, Any],
        local_epochs: float = 1.0,
        local_steps: int | None = None,
    ) -> None:
        """Prepare the next client's local training (call before ``train()``)."""
        self.train_dataset = train_dataset
        self._reset_optimizer(learning_rate)
        self.lr_scheduler = None
        self.args.learning_rate = learning_rate
        if local_steps is not None:
            self.args.max_steps = local_steps
        else:
            self.args.max_steps = -1
            self.args.num_train_epochs = local_epochs
        self.algorithm = algorithm
        self.workspaces = workspaces
        self._views_of_workspace.clear()

    def release_memory(self) -> bool:
        """Between clients: give freed heap memory back to the OS if the process grew (see :class:`HeapTrimmer`)."""
        return self.heap.maybe_trim()

    def seed_for_client(self, seed: int) -> None:
        """Seed Python, NumPy and torch for one client's local training, like ``transformers.set_seed``.

        On a CPU run with a CUDA build of torch, ``torch.manual_seed`` also queues a CUDA seeding call
        together with a formatted stack trace for when CUDA initialises: ~0.5 ms per call, and the queue
        grows by several entries per client per round for the whole run. Training on the CPU only reads
        the CPU generators, so they are seeded directly (the same states ``set_seed`` gives them).
        """
        if self.args.device.type == "cpu" and not torch.cuda.is_initialized():
            random.seed(seed)
            np.random.seed(seed)
            torch.default_generator.manual_seed(seed)
        else:
            set_seed(seed)

    # -- reuse between clients ----------------------------------------------------------------------
    def _reset_optimizer(self, learning_rate: float) -> None:
        """Give the next client a fresh optimizer: the prepared one with its state cleared, or a new one."""
        optimizer = self.optimizer
        inner = getattr(optimizer, "optimizer", optimizer)
        reusable = (
            self.reuse_between_clients
            and optimizer is not None
            and getattr(optimizer, "_is_accelerate_prepared", False)
            and type(inner).__module__.startswith("torch.optim.")
            and self._uniform_lr
        )
        if not reusable:
            self.optimizer = None
            return
        inner.state.clear()  # torch optimizers create their per-parameter state lazily on the first step
        for group in inner.param_groups:
            # initial_lr is where the new scheduler starts (LambdaLR only sets it when it is missing)
            group["lr"] = group["initial_lr"] = learning_rate

    def create_optimizer(self, model=None):
        created = self.optimizer is None
        optimizer = super().create_optimizer(model)
        if created:  # reused only when every group follows args.learning_rate (no per-group rates)
            self._uniform_lr = {g["lr"] for g in getattr(optimizer, "param_groups", [])} == {self.args.learning_rate}
        return optimizer

    def _prepare_for_training(self, max_steps, train_dataloader, resume_from_checkpoint):
        """Skip accelerate's preparation when the model and the reused optimizer already went through it.

        For an already prepared model and optimizer, ``Trainer._prepare_for_training`` only re-registers
        them with the accelerator (``accelerator.prepare`` returns them unchanged) and builds the
        scheduler; that is all this does, without the checks of ``prepare`` (~0.3 ms per client). Any
        other set-up (DeepSpeed, FSDP, a resume, a new optimizer) takes the Trainer's own path.
        """
        accelerator = self.accelerator
        prepared = (
            self.reuse_between_clients
            and resume_from_checkpoint is None
            and not (self.is_deepspeed_enabled or self.is_fsdp_enabled or self.is_fsdp_xla_enabled)
            and not self.is_distributed_loading_by_transformers
            and getattr(accelerator, "parallelism_config", None) is None
            and self.model_wrapped is self.model
            and getattr(self.model, "_is_accelerate_prepared", False)
            and getattr(self.optimizer, "_is_accelerate_prepared", False)
        )
        if not prepared:
            return super()._prepare_for_training(max_steps, train_dataloader, resume_from_checkpoint)
        for registry, item in ((accelerator._models, self.model), (accelerator._optimizers, self.optimizer)):
            if item not in registry:
                registry.append(item)
        self.lr_scheduler = None
        self._created_lr_scheduler = False
        self.create_scheduler(num_training_steps=max_steps)
        for attr in ("model", "optimizer", "lr_scheduler"):
            setattr(self.callback_handler, attr, getattr(self, attr))
        self.callback_handler.train_dataloader = train_dataloader
        return self.model, train_dataloader

    # -- the client's loop ---------------------------------------------------------------------------
    def _inner_training_loop(self, batch_size=None, args=None, resume_from_checkpoint=None, trial=None,
                             ignore_keys_for_eval=None):
        if not self._client_loop_applies(args, resume_from_checkpoint, trial):
            return super()._inner_training_loop(batch_size, args, resume_from_checkpoint, trial, ignore_keys_for_eval)
        return self._client_loop(args)

    def _client_loop_applies(self, args, resume_from_checkpoint, trial) -> bool:
        """Whether :meth:`_client_loop` does everything the Trainer's loop would for this configuration.

        The federated loop turns off the local Trainer's logging, evaluation, saving and pushing; what its
        loop then still does per client beyond the steps (callback events, logging bookkeeping, speed and
        memory metrics, a checkpoint folder scan) costs ~1 ms, as much as a small model's local round
        spends in half its optimizer steps. Anything else (DeepSpeed, FSDP, callbacks, resume, LOMO, ...)
        takes the Trainer's own loop.
        """
        return (
            self.reuse_between_clients
            and resume_from_checkpoint is None
            and trial is None
            and all(type(cb) is DefaultFlowCallback for cb in self.callback_handler.callbacks)
            and args.save_strategy == "no" and args.eval_strategy == "no" and args.logging_strategy == "no"
            and not (args.logging_nan_inf_filter or args.auto_find_batch_size or args.torch_empty_cache_steps)
            and not (args.eval_on_start or args.logging_first_step or args.include_num_input_tokens_seen not in (False, "no"))
            and args.n_gpu <= 1
            and not (self.is_deepspeed_enabled or self.is_fsdp_enabled or self.is_fsdp_xla_enabled)
            and not self.is_distributed_loading_by_transformers
            and getattr(self.accelerator, "parallelism_config", None) is None
            and self.neftune_noise_alpha is None
            and "lomo" not in str(args.optim)
        )

    def _client_loop(self, args) -> TrainOutput:
        """The Trainer's loop without what the federated loop has turned off: the same batches (in micro-batches
        of ``gradient_accumulation_steps``, the loss normalised as the Trainer does), the same clipping,
        optimizer and scheduler steps, stopping at ``max_steps``; bit-identical results (tested)."""
        self.client_loops += 1
        self.accelerator.free_memory()
        train_dataloader = self.get_train_dataloader()
        num_train_epochs, num_update_steps_per_epoch, _, _, _, steps_in_epoch, max_steps = (
            self.set_initial_training_values(args, train_dataloader)
        )
        self.state = TrainerState()
        self.state.train_batch_size = self._train_batch_size
        self.state.compute_steps(args, max_steps)
        model, train_dataloader = self._prepare_for_training(max_steps, train_dataloader, None)
        accumulation = args.gradient_accumulation_steps
        total_loss = torch.zeros((), device=args.device)
        model.zero_grad()
        state = self.state
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
                batch_samples, num_items_in_batch = self.get_batch_samples(epoch_iterator, num_batches, args.device)
                self.current_gradient_accumulation_steps = len(batch_samples)
                for index, inputs in enumerate(batch_samples):
                    step += 1
                    sync = (step + 1) % accumulation == 0 or step + 1 == steps_in_epoch
                    self.accelerator.gradient_state._set_sync_gradients(sync)
                    if index == len(batch_samples) - 1:
                        total_loss += self.training_step(model, inputs, num_items_in_batch)
                    else:
                        with self.accelerator.no_sync(model=model):
                            total_loss += self.training_step(model, inputs, num_items_in_batch)
                    if sync:
                        if args.max_grad_norm > 0:
                            self._clip_grad_norm(model)
                        self.optimizer.step()
                        if not self.accelerator.optimizer_step_was_skipped:
                            self.lr_scheduler.step()
                        model.zero_grad()
                        state.global_step += 1
                        state.epoch = epoch + (step + 1) / steps_in_epoch
                        if state.global_step >= max_steps:
                            break
                if state.global_step >= max_steps:
                    break
            if step < 0 or state.global_step >= max_steps:
                break
        self.is_in_train = False
        train_loss = total_loss.item() / max(state.global_step, 0.001)
        return TrainOutput(state.global_step, train_loss, {"train_loss": train_loss})

    def _clip_grad_norm(self, model):
        """The Trainer's clipping where accelerate's ``clip_grad_norm_`` reduces to torch's: one process, no fp16
        grad scaler to unscale first, no FSDP, DeepSpeed or sharded (DTensor) gradients.

        accelerate then calls ``torch.nn.utils.clip_grad_norm_`` on ``list(model.parameters())``; this does the
        same on the same list, made once, without the per-step dispatch (the parameter walk, version and type
        checks) and, on a CPU, without multiplying the gradients by a clip coefficient of exactly 1: together
        ~0.2 ms of a ~5 ms step on the benchmark CNN. Bit-identical; anything else takes the Trainer's path.
        """
        accelerator = self.accelerator
        if (
            accelerator.distributed_type == DistributedType.NO
            and getattr(accelerator, "scaler", None) is None
            and not is_sagemaker_mp_enabled()
            and not (self.is_deepspeed_enabled or self.is_fsdp_enabled)
            and os.environ.get("ACCELERATE_USE_FSDP", "false").lower() != "true"
            and not self._has_mixed_mesh_grads(model)
        ):
            cached = self._clip_parameters
            if cached is None or cached[0] is not model:
                cached = self._clip_parameters = (model, list(model.parameters()))
            parameters, max_norm = cached[1], self.args.max_grad_norm
            # torch.nn.utils.clip_grad_norm_ in its two halves (the same calls), so that on a CPU the scaling
            # can be skipped when it is by exactly 1: torch multiplies anyway to spare accelerators a
            # device -> host sync, which a CPU tensor does not need (a pass over the gradients a step)
            total_norm = torch.nn.utils.get_total_norm([p.grad for p in parameters if p.grad is not None])
            if total_norm.device.type == "cpu" and bool(max_norm / (total_norm + 1e-6) >= 1.0):
                return total_norm
            torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, total_norm)
            return total_norm
        return super()._clip_grad_norm(model)

    def get_train_dataloader(self):
        """The client's prepared dataloader from an earlier visit, rewound to the current seed, or a new one."""
        dataset = self.train_dataset
        args = self.args
        signature = (self._train_batch_size, args.dataloader_drop_last, args.dataloader_num_workers,
                     args.remove_unused_columns, id(self.data_collator))
        key = id(dataset)
        entry = self._train_loaders.get(key) if self.reuse_between_clients else None
        if entry is not None and entry[0] is dataset and entry[2] == signature:
            loader = entry[1]
            _rewind(loader, _seedable_sampler(loader))
            self._train_loaders.move_to_end(key)
            return loader
        loader = super().get_train_dataloader()
        if self.reuse_between_clients and _seedable_sampler(loader) is not None:
            # the entry holds the dataset itself, so its id cannot be reused by another object meanwhile
            self._train_loaders[key] = (dataset, loader, signature)
            while len(self._train_loaders) > MAX_CACHED_DATALOADERS:
                self._train_loaders.popitem(last=False)
        return loader

    def _release_previous_client(self, *objects):
        accelerator = self.accelerator
        accelerator._schedulers, accelerator._optimizers, accelerator._models, accelerator._dataloaders = [], [], [], []
        accelerator.step = 0
        return objects[0] if len(objects) == 1 else objects

    def floating_point_ops(self, inputs) -> int:
        # The Trainer counts FLOPs on every step for `total_flos`; nothing federated reads it.
        return 0

    def _bias_scale(self) -> float:
        """Weight of non-gradient terms per micro-batch: loss scale / accumulation steps."""
        scaler = getattr(self.accelerator, "scaler", None)
        scale = float(scaler.get_scale()) if scaler is not None and scaler.is_enabled() else 1.0
        return scale / max(1, getattr(self, "current_gradient_accumulation_steps", 1) or 1)

    def _scratch(self, name: str) -> tuple[torch.Tensor, list[torch.Tensor]] | None:
        """A preallocated flat vector and its per-parameter views, reused by every step (``None`` when reuse
        is off: the reference path allocates per step)."""
        if not self.reuse_between_clients:
            return None
        entry = self._scratch_vectors.get(name)
        if entry is None:
            space = self.space
            vector = torch.empty(space.numel, dtype=space.dtype, device=space.device)
            entry = self._scratch_vectors[name] = (vector, space.split(vector))
        return entry

    def training_step(self, model, inputs, num_items_in_batch=None):
        algorithm = self.algorithm
        if algorithm is None or algorithm.is_plain_gradient:
            self.gradient_passes += 1
            return super().training_step(model, inputs, num_items_in_batch)

        space = self.space
        reuse = self.reuse_between_clients
        if reuse and algorithm.corrects_grads_in_place and not space.has_grad():
            return self._corrected_step_in_place(model, inputs, num_items_in_batch)
        # gradients of earlier micro-batches of this step, set aside while the passes run
        earlier_buffer = self._scratch("earlier")
        earlier = space.grad(out=earlier_buffer and earlier_buffer[0]) if space.has_grad() else None
        saved: list[torch.Tensor] = []  # a copy of w, made only when someone needs it

        def current_params() -> torch.Tensor:
            if not saved:
                buffer = self._scratch("params")
                saved.append(space.flatten(out=buffer and buffer[0]))
            return saved[0]

        def grad_at(offset: torch.Tensor | None):
            space.clear_grad()
            self.gradient_passes += 1
            if offset is None:
                loss = Trainer.training_step(self, model, inputs, num_items_in_batch)
            else:
                shifted = self._scratch("shifted")
                with space.shifted(offset, out_views=shifted and shifted[1]):
                    loss = Trainer.training_step(self, model, inputs, num_items_in_batch)
            # A fresh vector per pass (perturbations combine several passes' gradients). Letting the backward
            # accumulate into a preallocated flat buffer instead was measured slower on a CPU: autograd then
            # adds each new gradient into the buffer (an extra pass) instead of keeping the tensor it made.
            return loss, space.grad()

        # get_scale() synchronises with the GPU: ask only when a correction will use it
        bias_scale = self._bias_scale() if algorithm.corrections else 1.0
        loss, direction = algorithm.direction(grad_at, current_params, self.workspaces, bias_scale)
        if earlier is not None:
            direction = torch.add(direction, earlier, out=vectors.empty_like(direction))
        space.set_grad_(direction)
        return loss

    def _corrected_step_in_place(self, model, inputs, num_items_in_batch):
        """The corrected step without flat copies of ``g`` (the first micro-batch of a step, a perturbation with
        one pass at a fixed offset): the gradient stays in ``p.grad`` and the corrections add to it in place.
        Bit-identical to the flat path (tested), which remains for everything else."""
        algorithm, space, workspaces = self.algorithm, self.space, self.workspaces
        self.in_place_steps += 1
        offset = algorithm.perturbation.fixed_offset(workspaces[algorithm.perturbation.name])
        self.gradient_passes += 1
        if offset is None:
            loss = Trainer.training_step(self, model, inputs, num_items_in_batch)
        else:
            with space.shifted(offset, self._workspace_views(offset), self._scratch("shifted")[1]):
                loss = Trainer.training_step(self, model, inputs, num_items_in_batch)
        grads = [p.grad for p in space.params]
        if any(g is None for g in grads):  # a parameter without gradient: the flat path fills in zeros
            space.set_grad_(space.grad())
            grads = [p.grad for p in space.params]
        bias_scale = self._bias_scale() if algorithm.corrections else 1.0
        with torch.no_grad():
            algorithm.correct_grads_(grads, space.params, workspaces, self._workspace_views, bias_scale)
        return loss

    #: workspace vectors whose views are kept (a piece splitting per-step temporaries must not grow it)
    MAX_WORKSPACE_VIEWS = 16

    def _workspace_views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """``space.split(flat)`` for a vector fixed for the client's round (a correction's shift, LESAM's offset),
        made once per client instead of every step (splitting cost ~0.1 ms a step, like the correction itself)."""
        entry = self._views_of_workspace.get(id(flat))  # (the entry holds flat: its id is not reused meanwhile)
        if entry is None:
            if len(self._views_of_workspace) >= self.MAX_WORKSPACE_VIEWS:
                self._views_of_workspace.clear()
            entry = self._views_of_workspace[id(flat)] = (flat, self.space.split(flat))
        return entry[1]


class HeapTrimmer:
    """Give the heap memory freed by finished clients back to the OS once it holds ``slack_bytes`` of it.

    glibc keeps freed blocks in its heap and, past its first frees of a size, serves model-sized tensors
    from the heap instead of fresh mappings. Each client round allocates and frees several model-sized
    vectors (update, state, copies) between long-lived small objects (a new client's dataset and
    dataloader), so with thousands of clients the heap fragments and the resident set grows by a few MB
    per new client although live memory stays flat (measured: +35 MB per round of 10 new SCAFFOLD
    clients, 0.35M parameters, with the disk store; flat with ``malloc_trim``). ``malloc_trim(0)``
    returns the free pages. It runs when the resident memory malloc is not using (anonymous resident
    memory minus the bytes malloc has handed out, glibc's ``mallinfo2``) has grown by ``slack_bytes``
    since the last trim: growth that is live memory (the client states of a stateful algorithm, cached
    client datasets) is not a reason to trim, and trimming for it returned free pages that training then
    faulted back in (SCAFFOLD in the benchmark: 3-4 trims per 20 rounds, ~730 extra page faults per
    round inside local training, 1.148 -> 1.116 of FedAvg's round time without them). Where
    ``mallinfo2`` is missing (glibc < 2.33) the growth of the whole resident set is used. At most one
    trim per ``min_calls_between`` checks (clients): a trim costs ~5 ms plus faulting the allocator's
    working set back in (~10 ms for 100 MB here). The measures are read on the first and then every
    ``check_every``-th call only. The same remedy as Dask's documented ``malloc_trim``. A no-op where
    ``malloc_trim`` does not exist (macOS, Windows, musl).
    """

    def __init__(self, slack_bytes: int = HEAP_TRIM_SLACK_BYTES, min_calls_between: int = 50, check_every: int = 8):
        self.slack_bytes = slack_bytes
        self.min_calls_between = min_calls_between
        self.check_every = check_every
        self.trims = 0
        self._calls = 0
        self._last_trim_call: int | None = None
        self._malloc_trim = _find_malloc_trim()
        self._baseline = self.unused_resident_bytes() if self._malloc_trim is not None else 0

    @staticmethod
    def unused_resident_bytes() -> int:
        """Resident memory malloc holds but has not handed out (plus a constant: the other anonymous memory);
        the whole resident set where glibc cannot say what it has handed out."""
        in_use = malloc_in_use_bytes()
        if in_use is None:
            return resident_set_bytes()
        return anonymous_resident_bytes() - in_use

    def maybe_trim(self) -> bool:
        """Trim if the unused resident memory outgrew the slack (and the last trim is long enough ago)."""
        if self._malloc_trim is None:
            return False
        self._calls += 1
        if (self._calls - 1) % self.check_every:
            return False
        if self._last_trim_call is not None and self._calls - self._last_trim_call < self.min_calls_between:
            return False
        if self.unused_resident_bytes() - self._baseline <= self.slack_bytes:
            return False
        self._malloc_trim(0)
        self.trims += 1
        self._last_trim_call = self._calls
        self._baseline = self.unused_resident_bytes()
        return True


def _statm_pages() -> list[int]:
    with open("/proc/self/statm", "rb") as handle:
        return [int(field) for field in handle.read().split()]


def resident_set_bytes() -> int:
    """Current resident set size of this process (0 where ``/proc`` does not exist)."""
    try:
        return _statm_pages()[1] * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def anonymous_resident_bytes() -> int:
    """Resident memory not backed by files (heap, anonymous mappings): resident minus shared pages of statm."""
    try:
        pages = _statm_pages()
        return (pages[1] - pages[2]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


@functools.lru_cache(maxsize=None)
def _libc():
    """The C library, or None where it cannot be loaded."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


@functools.lru_cache(maxsize=None)
def _find_mallinfo2():
    mallinfo2 = getattr(_libc(), "mallinfo2", None)
    if mallinfo2 is not None:
        mallinfo2.argtypes, mallinfo2.restype = [], _MallInfo2
    return mallinfo2


def malloc_in_use_bytes() -> int | None:
    """Bytes malloc has handed out and not got back (heap blocks in use + mmapped blocks), all arenas;
    ``None`` without glibc's ``mallinfo2``."""
    mallinfo2 = _find_mallinfo2()
    if mallinfo2 is None:
        return None
    info = mallinfo2()
    return int(info.uordblks) + int(info.hblkhd)


@functools.lru_cache(maxsize=None)
def _find_malloc_trim():
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is None or not resident_set_bytes():
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


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


_LOOKUPS_CACHED = False


def _cache_accelerate_package_lookups() -> None:
    """Cache accelerate's ``is_lomo_available()`` and ``is_deepspeed_available()``.

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
