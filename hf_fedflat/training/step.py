"""One micro-batch of a client's local step: perturbation -> corrections -> ``p.grad``.

A function of the parameters, the algorithm, the client's workspaces and a ``backward()`` that runs one
forward and backward pass of the current micro-batch at the parameters' current values (the Trainer's own
``training_step`` in :class:`~hf_fedflat.training.ClientTrainer`; any closure in a test). It leaves the
step's direction in ``p.grad`` for the optimizer (and the clipping before it) and returns the loss.

Three paths, chosen from the pieces (never from the algorithm's name), with the same numbers:

* **plain**: the perturbation is one gradient at a fixed offset (:class:`FixedOffsetPerturbation`), that
  offset is None and there is no correction: ``backward()`` alone, gradients accumulate in ``p.grad`` as in
  an ordinary Trainer step (FedAvg, FedLESAM before a client has an estimate).
* **in place**: a fixed-offset perturbation on the first micro-batch of a step (nothing in ``p.grad`` yet):
  one pass at ``w + e`` (the parameters' data swapped, :meth:`ParameterSpace.shifted`), the gradient stays
  in ``p.grad`` and each correction's formula is evaluated on it in place (:func:`affine.evaluate_`): no flat
  copy of ``g`` or ``w`` per step.
* **flat**: everything else. ``grad_at(offset)`` runs a pass at ``w + offset`` and returns the flat gradient;
  the perturbation combines passes into ``d``, each correction's formula is evaluated on flat vectors
  (:func:`affine.evaluate`, the same operations in the same order as in place), gradients of earlier
  micro-batches of the same optimizer step are added, and ``d`` becomes ``p.grad``.

Terms of a correction that do not come from the minibatch gradient are multiplied by ``bias_scale()`` (loss
scale / accumulation steps), asked only when there is a correction (it synchronises with the GPU).

A perturbation that needs second derivatives (DFedGAM's ``H g``) calls ``grad_at.hessian_vector_product(v)``
on the flat path: a forward pass through ``forward()`` (the loss with its graph, no backward), ``g`` by
``torch.autograd.grad(..., create_graph=True)`` and ``H v`` by a second backward of ``g . v``. It counts as two
passes. Any positive scale of that loss (accumulation steps, fp16 loss scale) scales ``g`` and ``H v`` alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..algorithms.affine import evaluate, evaluate_, expressions
from ..algorithms.base import FixedOffsetPerturbation
from ..algorithms.composed import FederatedAlgorithm
from .parameters import ParameterSpace

Tensor = torch.Tensor
#: ``scratch(name)`` -> a preallocated flat vector and its per-parameter views, or None (allocate)
Scratch = Callable[[str], "tuple[Tensor, list[Tensor]] | None"]


@dataclass
class StepResult:
    """What one micro-batch cost: its loss, the forward+backward passes run, and whether it took the in-place path."""

    loss: Tensor
    gradient_passes: int
    in_place: bool = False


def _no_scratch(name: str) -> None:
    return None


def training_step(
    space: ParameterSpace,
    algorithm: FederatedAlgorithm,
    workspaces: dict[str, Any],
    backward: Callable[[], Tensor],
    *,
    bias_scale: Callable[[], float] = lambda: 1.0,
    in_place: bool = True,
    scratch: Scratch = _no_scratch,
    workspace_views: Callable[[Tensor], list[Tensor]] | None = None,
    forward: Callable[[], Tensor] | None = None,
) -> StepResult:
    """Put this micro-batch's share of the step direction in ``p.grad``; see the module docstring.

    Args:
        space: the trainable parameters.
        algorithm: the composition (its perturbation and corrections are used).
        workspaces: what each client piece's ``begin`` returned for this client, by piece name.
        backward: one forward+backward pass at the parameters' current values; returns the loss.
        bias_scale: the factor of the non-gradient terms (loss scale / accumulation steps).
        in_place: allow the in-place path (False: the flat path, the reference the fast path is tested against).
        scratch: preallocated vectors reused between steps (``"earlier"``, ``"params"``, ``"shifted"``).
        workspace_views: per-parameter views of a vector fixed for the client's round (cached by the caller);
            default ``space.split``.
        forward: the micro-batch's loss at the parameters' current values with its graph, no backward (for
            Hessian-vector products; None: a perturbation asking for one raises).
    """
    if takes_plain_step(algorithm, workspaces):
        return StepResult(backward(), 1)
    perturbation = algorithm.perturbation
    if in_place and isinstance(perturbation, FixedOffsetPerturbation) and not space.has_grad():
        offset = perturbation.offset(workspaces[perturbation.name])
        return _in_place_step(space, algorithm, workspaces, backward, offset, bias_scale, scratch,
                              workspace_views or space.split)
    return _flat_step(space, algorithm, workspaces, backward, bias_scale, scratch, forward)


def takes_plain_step(algorithm: FederatedAlgorithm, workspaces: dict[str, Any]) -> bool:
    """Whether the step is the minibatch gradient itself (one pass at ``w``, nothing added): the Trainer's own step."""
    perturbation = algorithm.perturbation
    return (isinstance(perturbation, FixedOffsetPerturbation) and not algorithm.corrections
            and perturbation.offset(workspaces[perturbation.name]) is None)


def _in_place_step(space, algorithm, workspaces, backward, offset, bias_scale, scratch, views) -> StepResult:
    if offset is None:
        loss = backward()
    else:
        shifted = scratch("shifted")
        with space.shifted(offset, views(offset), shifted and shifted[1]):
            loss = backward()
    grads = [p.grad for p in space.params]
    if any(g is None for g in grads):  # a parameter without gradient: the flat path fills in zeros
        space.set_grad_(space.grad())
        grads = [p.grad for p in space.params]
    scale = bias_scale() if algorithm.corrections else 1.0
    with torch.no_grad():
        for expression in expressions(algorithm.corrections, workspaces):
            evaluate_(expression, grads, space.params, views, scale)
    return StepResult(loss, 1, in_place=True)


def _flat_step(space, algorithm, workspaces, backward, bias_scale, scratch, forward=None) -> StepResult:
    # gradients of earlier micro-batches of this step, set aside while the passes run
    earlier_buffer = scratch("earlier")
    earlier = space.grad(out=earlier_buffer and earlier_buffer[0]) if space.has_grad() else None
    saved: list[Tensor] = []  # a copy of w, made only when a correction reads it
    passes = 0

    def current_params() -> Tensor:
        if not saved:
            buffer = scratch("params")
            saved.append(space.flatten(out=buffer and buffer[0]))
        return saved[0]

    def grad_at(offset: Tensor | None):
        nonlocal passes
        space.clear_grad()
        passes += 1
        if offset is None:
            loss = backward()
        else:
            shifted = scratch("shifted")
            with space.shifted(offset, out_views=shifted and shifted[1]):
                loss = backward()
        # A fresh vector per pass (perturbations combine several passes' gradients). Letting the backward
        # accumulate into a preallocated flat buffer instead was measured slower on a CPU: autograd then
        # adds each new gradient into the buffer (an extra pass) instead of keeping the tensor it made.
        return loss, space.grad()

    def hessian_vector_product(vector: Tensor | None = None):
        nonlocal passes
        if forward is None:
            raise TypeError("A Hessian-vector product needs training_step(..., forward=<the loss with its graph>); "
                            "none was given. Use hvp_mode='finite_difference' to need only gradients.")
        passes += 2
        params = space.params
        with torch.enable_grad():
            loss = forward()
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

    grad_at.hessian_vector_product = hessian_vector_product

    scale = bias_scale() if algorithm.corrections else 1.0
    perturbation = algorithm.perturbation
    loss, direction = perturbation.direction(grad_at, workspaces[perturbation.name])
    for expression in expressions(algorithm.corrections, workspaces):
        direction = evaluate(expression, direction, current_params, scale)
    if earlier is not None:
        direction = torch.add(direction, earlier)
    space.set_grad_(direction)
    return StepResult(loss, passes)
