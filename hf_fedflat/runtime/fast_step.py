"""The training step's fast form (mechanism ``step_buffers``): the reference step's numbers
(:func:`hf_fedflat.training.step.training_step`), bit for bit, with less memory traffic.

* **in place**: a fixed-offset perturbation (:class:`FixedOffsetPerturbation`) on the first micro-batch of a step
  (nothing in ``p.grad`` yet): one pass at ``w + e`` (the parameters' data swapped, :meth:`ParameterSpace.shifted`),
  the gradient stays in ``p.grad`` and each correction's formula is evaluated on it in place
  (:func:`affine.evaluate_`, the same operations in the same order as the flat evaluation): no flat copy of ``g``
  or ``w`` per step.
* otherwise the reference's flat form with the step's flat vectors preallocated once per trainer (``vectors``).

``views(flat)``: the per-parameter views of a vector fixed for the client's round (a correction's shift, LESAM's
offset), kept by the caller so that they are not split at every step.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..algorithms.affine import evaluate_, expressions
from ..algorithms.base import FixedOffsetPerturbation
from ..algorithms.composed import FederatedAlgorithm
from ..training.parameters import ParameterSpace
from ..training.step import StepResult, VectorSource, flat_step, takes_plain_step

Tensor = torch.Tensor


def training_step(
    space: ParameterSpace,
    algorithm: FederatedAlgorithm,
    workspaces: dict[str, Any],
    backward: Callable[[], Tensor],
    *,
    vectors: VectorSource,
    views: Callable[[Tensor], list[Tensor]],
    bias_scale: Callable[[], float] = lambda: 1.0,
    forward: Callable[[], Tensor] | None = None,
) -> StepResult:
    """:func:`hf_fedflat.training.step.training_step`'s result, the fast way; see the module docstring."""
    if takes_plain_step(algorithm, workspaces):
        return StepResult(backward(), 1)
    perturbation = algorithm.perturbation
    if isinstance(perturbation, FixedOffsetPerturbation) and not space.has_grad():
        offset = perturbation.offset(workspaces[perturbation.name])
        return in_place_step(space, algorithm, workspaces, backward, offset, bias_scale, vectors, views)
    return flat_step(space, algorithm, workspaces, backward, bias_scale=bias_scale, forward=forward, vectors=vectors)


def in_place_step(space: ParameterSpace, algorithm: FederatedAlgorithm, workspaces: dict[str, Any],
                  backward: Callable[[], Tensor], offset: Tensor | None, bias_scale: Callable[[], float],
                  vectors: VectorSource, views: Callable[[Tensor], list[Tensor]]) -> StepResult:
    """One pass at ``w + offset`` (``offset`` None: at ``w``), the corrections applied to ``p.grad`` in place."""
    if offset is None:
        loss = backward()
    else:
        shifted = vectors("shifted")
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
