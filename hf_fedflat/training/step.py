"""One micro-batch of a client's local step, the reference form: perturbation -> corrections -> ``p.grad``.

A function of the parameters, the algorithm, the client's workspaces and a ``backward()`` that runs one
forward and backward pass of the current micro-batch at the parameters' current values (the Trainer's own
``training_step`` in :class:`~hf_fedflat.training.ClientTrainer`; any closure in a test). It leaves the
step's direction in ``p.grad`` for the optimizer (and the clipping before it) and returns the loss.

* **plain**: the perturbation is one gradient at a fixed offset (:class:`FixedOffsetPerturbation`), that
  offset is None and there is no correction: ``backward()`` alone, gradients accumulate in ``p.grad`` as in
  an ordinary Trainer step (FedAvg, FedLESAM before a client has an estimate).
* **flat**: everything else. The perturbation asks a :class:`StepOracle` (the
  :class:`~hf_fedflat.algorithms.base.GradientOracle` of this micro-batch, wrapped by the runtime's non-finite
  fallback, :mod:`hf_fedflat.runtime.finite_fallback`) for gradients at offsets and combines them into ``d``; each
  correction's formula is evaluated on flat vectors (:func:`affine.evaluate`), gradients of earlier micro-batches
  of the same optimizer step are added, and ``d`` becomes ``p.grad``.

Terms of a correction that do not come from the minibatch gradient are multiplied by ``bias_scale()`` (loss
scale / accumulation steps), asked only when there is a correction (it synchronises with the GPU).

The runtime's fast form (:mod:`hf_fedflat.runtime.fast_step`) gives the same bits with preallocated vectors and,
for a fixed offset, the corrections applied to ``p.grad`` in place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..algorithms.affine import evaluate, expressions
from ..algorithms.base import FixedOffsetPerturbation
from ..algorithms.composed import FederatedAlgorithm
from ..runtime import finite_fallback
from .parameters import ParameterSpace

Tensor = torch.Tensor
#: ``vectors(name)`` -> a preallocated flat vector and its per-parameter views, or None (a new vector): where the flat
#: form writes the gradients of earlier micro-batches (``"earlier"``), the weights (``"params"``) and the shifted
#: weights of a perturbed pass (``"shifted"``)
VectorSource = Callable[[str], "tuple[Tensor, list[Tensor]] | None"]


@dataclass
class StepResult:
    """What one micro-batch cost: its loss, the forward+backward passes run, and whether it took the in-place path."""

    loss: Tensor
    gradient_passes: int
    in_place: bool = False


def new_vectors(name: str) -> None:
    """The reference form's :data:`VectorSource`: every vector is a new one."""
    return None


class StepOracle:
    """The :class:`~hf_fedflat.algorithms.base.GradientOracle` of one micro-batch over a :class:`ParameterSpace`.

    ``backward()`` is one forward and backward pass at the parameters' current values; ``forward()`` the loss with its
    graph and no backward (for Hessian-vector products; None: asking for one raises). ``passes`` counts the passes.
    """

    def __init__(self, space: ParameterSpace, backward: Callable[[], Tensor],
                 forward: Callable[[], Tensor] | None = None, vectors: VectorSource = new_vectors,
                 bias_scale: Callable[[], float] = lambda: 1.0):
        self.space, self._backward, self._forward, self._vectors = space, backward, forward, vectors
        self._bias_scale = bias_scale
        self.passes = 0
        self._weights: Tensor | None = None

    def __call__(self, offset: Tensor | None) -> tuple[Tensor, Tensor]:
        space = self.space
        space.clear_grad()
        self.passes += 1
        if offset is None:
            loss = self._backward()
        else:
            shifted = self._vectors("shifted")
            with space.shifted(offset, out_views=shifted and shifted[1]):
                loss = self._backward()
        # A fresh vector per pass (perturbations combine several passes' gradients). Letting the backward
        # accumulate into a preallocated flat buffer instead was measured slower on a CPU: autograd then
        # adds each new gradient into the buffer (an extra pass) instead of keeping the tensor it made.
        return loss, space.grad()

    def weights(self) -> Tensor:
        """``w``, flat: copied on the first call, then the same vector."""
        if self._weights is None:
            buffer = self._vectors("params")
            self._weights = self.space.flatten(out=buffer and buffer[0])
        return self._weights

    def parameter_mask(self, name_part: str) -> Tensor:
        """Flat bool vector: True on the entries of the parameters whose name contains ``name_part`` (cached by the
        parameter space for the run)."""
        return self.space.parameter_mask(name_part)

    def bias_scale(self) -> float:
        """The factor the step's gradients carry besides the loss's own (loss scale / accumulation steps): a term of
        the direction that is not a gradient is multiplied by it."""
        return self._bias_scale()

    def hessian_vector_product(self, vector: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """``(loss, g, H v)`` at ``w``: one forward (the loss with its graph), ``g`` by ``torch.autograd.grad(...,
        create_graph=True)`` and ``H v`` by a second backward of ``g . v`` (``v`` None: ``g``). Two passes. Any
        positive scale of that loss (accumulation steps, fp16 loss scale) scales ``g`` and ``H v`` alike."""
        if self._forward is None:
            raise TypeError("A Hessian-vector product needs training_step(..., forward=<the loss with its graph>); "
                            "none was given. Use hvp_mode='finite_difference' to need only gradients.")
        self.passes += 2
        space = self.space
        params = space.params
        with torch.enable_grad():
            loss = self._forward()
            grads = torch.autograd.grad(loss, params, create_graph=True, allow_unused=True)
            grads = [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]
            gradient = torch.cat([g.detach().reshape(-1) for g in grads])
            v = gradient if vector is None else vector
            dot = sum((g * part).sum() for g, part in zip(grads, space.split(v)) if g.requires_grad)
            if not isinstance(dot, torch.Tensor) or not dot.requires_grad:  # piecewise linear model: H = 0
                return loss.detach(), gradient, torch.zeros_like(gradient)
            products = torch.autograd.grad(dot, params, allow_unused=True)
        hv = torch.cat([(torch.zeros_like(p) if h is None else h).reshape(-1) for p, h in zip(params, products)])
        return loss.detach(), gradient, hv


def training_step(
    space: ParameterSpace,
    algorithm: FederatedAlgorithm,
    workspaces: dict[str, Any],
    backward: Callable[[], Tensor],
    *,
    bias_scale: Callable[[], float] = lambda: 1.0,
    forward: Callable[[], Tensor] | None = None,
) -> StepResult:
    """Put this micro-batch's share of the step direction in ``p.grad``; see the module docstring.

    Args:
        space: the trainable parameters.
        algorithm: the composition (its perturbation and corrections are used).
        workspaces: what each client piece's ``begin`` returned for this client, by piece name.
        backward: one forward+backward pass at the parameters' current values; returns the loss.
        bias_scale: the factor of the non-gradient terms (loss scale / accumulation steps).
        forward: the micro-batch's loss at the parameters' current values with its graph, no backward (for
            Hessian-vector products; None: a perturbation asking for one raises).
    """
    if takes_plain_step(algorithm, workspaces):
        return StepResult(backward(), 1)
    return flat_step(space, algorithm, workspaces, backward, bias_scale=bias_scale, forward=forward)


def takes_plain_step(algorithm: FederatedAlgorithm, workspaces: dict[str, Any]) -> bool:
    """Whether the step is the minibatch gradient itself (one pass at ``w``, nothing added): the Trainer's own step."""
    perturbation = algorithm.perturbation
    return (isinstance(perturbation, FixedOffsetPerturbation) and not algorithm.corrections
            and perturbation.offset(workspaces[perturbation.name]) is None)


def flat_step(
    space: ParameterSpace,
    algorithm: FederatedAlgorithm,
    workspaces: dict[str, Any],
    backward: Callable[[], Tensor],
    *,
    bias_scale: Callable[[], float] = lambda: 1.0,
    forward: Callable[[], Tensor] | None = None,
    vectors: VectorSource = new_vectors,
) -> StepResult:
    """The flat form (see the module docstring); ``vectors``: where its flat vectors go (the runtime's fast form
    passes preallocated ones)."""
    # gradients of earlier micro-batches of this step, set aside while the passes run
    earlier_buffer = vectors("earlier")
    earlier = space.grad(out=earlier_buffer and earlier_buffer[0]) if space.has_grad() else None
    oracle = StepOracle(space, backward, forward, vectors, bias_scale)
    scale = bias_scale() if algorithm.corrections else 1.0
    perturbation = algorithm.perturbation
    loss, direction = finite_fallback.direction(perturbation, oracle, workspaces[perturbation.name], space.device)
    for expression in expressions(algorithm.corrections, workspaces):
        direction = evaluate(expression, direction, oracle.weights, scale)
    if earlier is not None:
        direction = torch.add(direction, earlier)
    space.set_grad_(direction)
    return StepResult(loss, oracle.passes)
