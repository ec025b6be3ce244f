"""The local ``Trainer``: one per process, reused for every client it trains."""

from __future__ import annotations

from typing import Any

import torch
from transformers import Trainer
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from ..algorithms.composed import FederatedAlgorithm
from .parameters import ParameterSpace


class ClientTrainer(Trainer):
    """A ``transformers.Trainer`` whose step asks the client algorithm for the direction.

    Built once per process; :meth:`start_client` swaps in the next client's data, drops the optimizer
    and scheduler (so they are rebuilt with the round's learning rate) and sets the local work. The
    Trainer's own loop still does mixed precision, gradient accumulation, clipping (of the final
    direction), the optimizer and scheduler steps.

    The step: ``grad_at(offset)`` runs the Trainer's ordinary ``training_step`` (forward, loss scaled
    for accumulation, backward through the accelerator) at ``w + offset`` and restores ``w`` from a
    saved copy; the perturbation combines such passes into a direction, the corrections adjust it, and
    the result becomes ``p.grad`` (added to the gradients of earlier micro-batches of the same step).
    """

    def __init__(self, *args, **kwargs):
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
        self.algorithm: FederatedAlgorithm | None = None
        self.workspaces: dict[str, Any] = {}
        #: forward+backward passes run so far (diagnostics and tests)
        self.gradient_passes = 0

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

    def training_step(self, model, inputs, num_items_in_batch=None):
        algorithm = self.algorithm
        if algorithm is None or algorithm.is_plain_gradient:
            self.gradient_passes += 1
            return super().training_step(model, inputs, num_items_in_batch)

        space = self.space
        earlier = space.grad() if space.has_grad() else None  # earlier micro-batches of this step
        saved: list[torch.Tensor] = []  # a copy of w, made only when someone needs it

        def current_params() -> torch.Tensor:
            if not saved:
                saved.append(space.flatten())
            return saved[0]

        def grad_at(offset: torch.Tensor | None):
            space.clear_grad()
            if offset is not None:
                params = current_params()
                space.add_(offset)
            self.gradient_passes += 1
            loss = Trainer.training_step(self, model, inputs, num_items_in_batch)
            if offset is not None:
                space.load_(params)  # restore from the copy: exact, unlike subtracting offset
            return loss, space.grad()

        # get_scale() synchronises with the GPU: ask only when a correction will use it
        bias_scale = self._bias_scale() if algorithm.corrections else 1.0
        loss, direction = algorithm.direction(grad_at, current_params, self.workspaces, bias_scale)
        if earlier is not None:
            direction = direction + earlier
        space.set_grad_(direction)
        return loss
