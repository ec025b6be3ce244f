"""The local ``Trainer``: one per process, reused for every client it trains."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable

import torch
from transformers import Trainer, set_seed
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from ..algorithms.base import LossContext, LossTerm
from ..algorithms.composed import FederatedAlgorithm
from . import step
from .parameters import ParameterSpace


class ClientTrainer(Trainer):
    """A ``transformers.Trainer`` whose step asks the client algorithm for the direction.

    Built once per process; :meth:`start_client` swaps in the next client's data, drops the optimizer (so every
    client starts like with a new optimizer, at the round's learning rate) and sets the local work. The Trainer's
    loop does mixed precision, gradient accumulation, clipping (of the final direction), the optimizer and
    scheduler steps; :meth:`training_step` is the algorithm's step (:func:`hf_fedflat.training.step.training_step`)
    and :meth:`compute_loss` adds the algorithm's loss terms.

    This is the reference: the runtime's ``FastClientTrainer`` (:mod:`hf_fedflat.runtime.fast_trainer`) gives the
    same weights bit for bit, faster; a federated run builds whichever the fast-path switch asks for.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Per-client logs would flood the console; the round loop reports instead.
        self.remove_callback(PrinterCallback)
        self.remove_callback(ProgressCallback)
        self.space = ParameterSpace(self.model)
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

    def release_memory(self) -> bool:
        """Between clients: give memory back to the OS; whether it did (here: never)."""
        return False

    def seed_for_client(self, seed: int) -> None:
        """Seed Python, NumPy and torch for one client's local training (``transformers.set_seed``)."""
        set_seed(seed)

    # -- the algorithm's step -------------------------------------------------------------------------
    def _bias_scale(self) -> float:
        """Weight of non-gradient terms per micro-batch: loss scale / accumulation steps."""
        scaler = getattr(self.accelerator, "scaler", None)
        scale = float(scaler.get_scale()) if scaler is not None else 1.0  # (a disabled scaler's scale is 1.0)
        return scale / max(1, getattr(self, "current_gradient_accumulation_steps", 1) or 1)

    def training_step(self, model, inputs, num_items_in_batch=None):
        """One micro-batch: the algorithm's step around the Trainer's own forward and backward pass."""
        if self.algorithm is None:
            self.gradient_passes += 1
            return super().training_step(model, inputs, num_items_in_batch)
        result = self.algorithm_step(
            lambda: self.forward_backward(model, inputs, num_items_in_batch),
            lambda: self._forward_loss(model, inputs, num_items_in_batch),
        )
        self.gradient_passes += result.gradient_passes
        return result.loss

    def forward_backward(self, model, inputs, num_items_in_batch=None) -> torch.Tensor:
        """One forward and backward pass of the micro-batch at the model's current weights: the Trainer's own."""
        return Trainer.training_step(self, model, inputs, num_items_in_batch)

    def algorithm_step(self, backward: Callable[[], torch.Tensor],
                       forward: Callable[[], torch.Tensor]) -> step.StepResult:
        """The algorithm's step for the current micro-batch (``backward``: one pass; ``forward``: the loss alone)."""
        return step.training_step(self.space, self.algorithm, self.workspaces, backward,
                                  bias_scale=self._bias_scale, forward=forward)

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
        outputs_at = lambda flat: self._outputs_at(inputs, flat)  # noqa: E731
        extra = sum(term.extra_loss(outputs, representation, LossContext(self.workspaces[term.name], represent_at,
                                                                          inputs, outputs_at)) for term in terms)
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
        with capture.active():
            self._outputs_at(inputs, flat)
            return capture.take(mask)

    def _outputs_at(self, inputs, flat: torch.Tensor):
        """The model's outputs for ``inputs`` (without their labels) at the trainable weights ``flat`` (no gradient,
        eval mode, the model's own weights untouched)."""
        params = dict(zip(self.space.names, self.space.split(flat.to(self.space.device, self.space.dtype))))
        inputs = {k: v for k, v in inputs.items() if k != "labels"}
        model = self.model  # the unwrapped model: the parameter names of self.space
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                return torch.func.functional_call(model, params, args=(), kwargs=inputs, strict=False)
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
