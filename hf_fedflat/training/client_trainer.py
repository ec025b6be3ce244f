"""The local ``Trainer``: one per process, reused for every client it trains."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import torch
from transformers import Trainer
from transformers.trainer_utils import SchedulerType
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from .. import runtime
from ..algorithms.base import LossContext, LossTerm
from ..algorithms.composed import FederatedAlgorithm
from ..runtime import client_loop, fast_step
from ..runtime import trainer as fast
from ..runtime.memory import HeapTrimmer
from . import step
from .parameters import ParameterSpace


class ClientTrainer(Trainer):
    """A ``transformers.Trainer`` whose step asks the client algorithm for the direction.

    Built once per process; :meth:`start_client` swaps in the next client's data, resets the optimizer
    (so every client starts like with a new optimizer, at the round's learning rate) and sets the local
    work. The Trainer's loop does mixed precision, gradient accumulation, clipping (of the final
    direction), the optimizer and scheduler steps; :meth:`training_step` is the algorithm's step.

    The overrides below only delegate to :mod:`hf_fedflat.runtime.trainer` when the fast path
    (``runtime.switch``, read once when the trainer is built: ``self.fast_path``) has the mechanism on,
    and to the Trainer's own code otherwise; both give bit-identical weights (tested). What is reused
    between clients on the fast path: the prepared optimizer (state cleared) and the step's scratch
    vectors. Each client runs the lean client loop (:mod:`hf_fedflat.runtime.client_loop`) where it does all the
    Trainer's loop would, else the Trainer's own loop.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Per-client logs would flood the console; the round loop reports instead.
        self.remove_callback(PrinterCallback)
        self.remove_callback(ProgressCallback)
        self.space = ParameterSpace(self.model)
        #: which speed mechanisms this trainer uses (the switch as it was when the trainer was built)
        self.fast_path: runtime.FastPath = runtime.current()
        if self.fast_path("free_memory") and not self.is_deepspeed_enabled:
            self.accelerator.free_memory = fast.release_previous_client(self.accelerator)
        if self.fast_path("cached_lookups"):
            fast.cache_accelerate_package_lookups()
        self.algorithm: FederatedAlgorithm | None = None
        self.workspaces: dict[str, Any] = {}
        #: forward+backward passes run so far (diagnostics and tests)
        self.gradient_passes = 0
        #: micro-batches that took the step's in-place path (see hf_fedflat.training.step)
        self.in_place_steps = 0
        self._uniform_lr = False  # every param group of the optimizer follows args.learning_rate
        self._scratch_vectors: dict[str, tuple[torch.Tensor, list[torch.Tensor]]] = {}
        #: per-parameter views of the client's workspace vectors, made on first use (see :meth:`_workspace_views`)
        self._views_of_workspace: dict[int, tuple[torch.Tensor, list[torch.Tensor]]] = {}
        #: clients trained by the lean client loop (``runtime.client_loop``) instead of the Trainer's loop
        self.lean_loop_clients = 0
        #: the micro-batch's forward and backward pass when not ``Trainer.training_step`` (the lean client loop's)
        self.forward_backward = None
        #: returns the heap memory of finished clients to the OS (call :meth:`release_memory` between clients)
        self.heap = HeapTrimmer()

    @property
    def keeps_step_buffers(self) -> bool:
        """The step keeps its scratch vectors and corrects ``p.grad`` in place (mechanism ``step_buffers``)."""
        return self.fast_path("step_buffers")

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
        if not (self.fast_path("optimizer_reuse") and fast.reset_optimizer(self, learning_rate, self._uniform_lr)):
            self.optimizer = None
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
        """Between clients: give freed heap memory back to the OS if it piled up (see ``HeapTrimmer``)."""
        return self.fast_path("heap_trim") and self.heap.maybe_trim()

    def seed_for_client(self, seed: int) -> None:
        """Seed Python, NumPy and torch for one client's local training, like ``transformers.set_seed``
        (on a CPU without its CUDA seeding call, see ``runtime.trainer.seed_cpu_generators``)."""
        fast.seed(self.args.device, seed, self.fast_path("seed_shortcut"))

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
                and type(self)._prepare_for_training is ClientTrainer._prepare_for_training)

    def _prepare_for_training(self, max_steps, train_dataloader, resume_from_checkpoint, schedule: bool = True):
        """The Trainer's, or for the reused optimizer :func:`~hf_fedflat.runtime.trainer.prepare_reused`.

        ``schedule=False`` (the lean client loop, under a constant schedule): with the reused optimizer no scheduler
        is built. The constant schedule's scheduler would set every group's rate to the one it already has
        (``reset_optimizer`` set both), at creation and at every step: ~90 us per client and ~15 us per step on
        workload 6 of issue 20, where a client trains ~1.6 steps of ~1.5 ms."""
        prepared = None
        if self.fast_path("optimizer_reuse"):
            prepared = fast.prepare_reused(self, max_steps, train_dataloader, resume_from_checkpoint, schedule)
        if prepared is None:
            return super()._prepare_for_training(max_steps, train_dataloader, resume_from_checkpoint)
        return prepared

    # -- the algorithm's step -------------------------------------------------------------------------
    def _bias_scale(self) -> float:
        """Weight of non-gradient terms per micro-batch: loss scale / accumulation steps."""
        scaler = getattr(self.accelerator, "scaler", None)
        scale = float(scaler.get_scale()) if scaler is not None and scaler.is_enabled() else 1.0
        return scale / max(1, getattr(self, "current_gradient_accumulation_steps", 1) or 1)

    def _scratch(self, name: str) -> tuple[torch.Tensor, list[torch.Tensor]] | None:
        """A preallocated flat vector and its per-parameter views, reused by every step (the fast form's)."""
        entry = self._scratch_vectors.get(name)
        if entry is None:
            space = self.space
            vector = torch.empty(space.numel, dtype=space.dtype, device=space.device)
            entry = self._scratch_vectors[name] = (vector, space.split(vector))
        return entry

    def training_step(self, model, inputs, num_items_in_batch=None):
        """One micro-batch: the algorithm's step (:func:`hf_fedflat.training.step.training_step`, or its fast form
        :func:`hf_fedflat.runtime.fast_step.training_step`) around the Trainer's own forward and backward pass."""
        if self.algorithm is None:
            self.gradient_passes += 1
            return super().training_step(model, inputs, num_items_in_batch)
        forward_backward = self.forward_backward or functools.partial(Trainer.training_step, self)
        backward = lambda: forward_backward(model, inputs, num_items_in_batch)  # noqa: E731
        forward = lambda: self._forward_loss(model, inputs, num_items_in_batch)  # noqa: E731
        if self.keeps_step_buffers:
            result = fast_step.training_step(self.space, self.algorithm, self.workspaces, backward,
                                             vectors=self._scratch, views=self._workspace_views,
                                             bias_scale=self._bias_scale, forward=forward)
        else:
            result = step.training_step(self.space, self.algorithm, self.workspaces, backward,
                                        bias_scale=self._bias_scale, forward=forward)
        self.gradient_passes += result.gradient_passes
        self.in_place_steps += result.in_place
        return result.loss

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """The Trainer's loss, plus the algorithm's loss terms (:class:`~hf_fedflat.algorithms.base.LossTerm`: MOON,
        FedDecorr) on training forwards. Without a loss term this is the Trainer's own method, untouched."""
        terms = self._loss_terms()
        if not terms or not model.training:
            return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)
        capture = self._representation_capture()
        mask = inputs.get("attention_mask") if isinstance(inputs, Mapping) else None
        with capture.active():
            loss, outputs = super().compute_loss(model, inputs, return_outputs=True,
                                                 num_items_in_batch=num_items_in_batch)
        representation = capture.take(mask)
        represent_at = lambda flat: self._represent_at(model, inputs, flat, mask)  # noqa: E731
        extra = sum(term.extra_loss(outputs, representation, LossContext(self.workspaces[term.name], represent_at,
                                                                          inputs)) for term in terms)
        if self.model_accepts_loss_kwargs and num_items_in_batch is not None:
            # the model's loss is already this micro-batch's share of the step (the Trainer does not divide it
            # by the accumulation steps then): give the per-micro-batch mean terms the same share
            extra = extra / max(1, getattr(self, "current_gradient_accumulation_steps", 1) or 1)
        loss = loss + extra
        return (loss, outputs) if return_outputs else loss

    def full_gradient(self, dataset) -> torch.Tensor:
        """The gradient of the mean loss over all of ``dataset`` at the model's current weights, flat (MimeLite's
        full-batch ``grad f_i(x)``, see ``ClientContext.full_gradient``).

        One pass over the data in batches of ``per_device_eval_batch_size`` (the eval dataloader: collator, no
        shuffling), each batch's mean loss weighted by its rows; the model in eval mode (no dropout, batch-norm
        running statistics used, not updated: the gradient of one deterministic function); no optimizer step, no
        loss term of the algorithm; ``p.grad`` is left empty."""
        model = self.model
        was_training = model.training
        model.eval()
        self.space.clear_grad()
        rows = 0
        try:
            for batch in self.get_eval_dataloader(dataset):
                inputs = self._prepare_inputs(batch)
                size = next(v for v in inputs.values() if isinstance(v, torch.Tensor)).shape[0]
                with self.compute_loss_context_manager():
                    loss = Trainer.compute_loss(self, model, inputs)
                (loss * size).backward()
                rows += size
            gradient = self.space.grad()
        finally:
            self.space.clear_grad()
            model.train(was_training)
        return gradient.div_(max(rows, 1))

    def _loss_terms(self) -> list:
        algorithm = self.algorithm
        if algorithm is None:
            return []
        return [piece for piece in algorithm.corrections if isinstance(piece, LossTerm)]

    def _representation_capture(self):
        model = self.model
        if getattr(self, "_capture", None) is None or self._capture_model is not model:
            from ..models.representation import RepresentationCapture

            self._capture, self._capture_model = RepresentationCapture(model), model
        return self._capture

    def _represent_at(self, model, inputs, flat: torch.Tensor, mask) -> torch.Tensor:
        """The representation of ``inputs`` at the trainable weights ``flat`` (no gradient, eval mode, the model's
        own weights untouched)."""
        capture = self._representation_capture()
        params = dict(zip(self.space.names, self.space.split(flat.to(self.space.device, self.space.dtype))))
        inputs = {k: v for k, v in inputs.items() if k != "labels"}
        model = self.model  # the unwrapped model: the parameter names of self.space
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad(), capture.active():
                torch.func.functional_call(model, params, args=(), kwargs=inputs, strict=False)
                return capture.take(mask)
        finally:
            model.train(was_training)

    def _forward_loss(self, model, inputs, num_items_in_batch=None) -> torch.Tensor:
        """The micro-batch's loss with its graph and no backward, as ``Trainer.training_step`` computes it (for
        the Hessian-vector products of a perturbation such as DFedGAM's)."""
        model.train()
        inputs = self._prepare_inputs(inputs)
        with self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
        if self.args.n_gpu > 1:
            loss = loss.mean()
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
