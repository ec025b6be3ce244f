"""Corrections as formulas: affine expressions over the direction ``D``, the weights ``W`` and workspace vectors.

A correction writes its formula once, with ordinary arithmetic on symbols::

    def correct(self, D, W, ws):            # FedProx
        return D + mu * W - mu * ws         # d + mu*w - mu*w^t

``D`` is the direction so far, ``W`` the current local weights, and ``ws`` the piece's workspace (what its
``begin`` returned) with every tensor in it turned into a symbol. The result is an :class:`Affine`
``s * D + sum_k c_k * x_k``; :func:`evaluate` computes it on flat vectors and :func:`evaluate_` on the
per-parameter gradients in place. Both run the same elementwise operations in the same order, so the two
paths give the same bits:

* ``D``'s own coefficient first (``d * s``, skipped when ``s == 1``);
* then every term in the order written: ``d += (c_k * bias_scale) * x_k``.

``bias_scale`` multiplies every term that is not the direction (``W`` and workspace vectors alike): with
gradient accumulation over M micro-batches and a loss scale S it is ``S / M``, so a term is added once per
optimizer step and scaled like the gradients. Terms are never merged or reordered (``a*x + b*x`` stays two
additions): what is written is what runs.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Union

import torch

Tensor = torch.Tensor


class _Weights:
    """The operand ``W``: the current local weights."""

    def __repr__(self) -> str:
        return "W"


WEIGHTS = _Weights()
Operand = Union[_Weights, Tensor]


class Affine:
    """``scale * D + sum_k coefficient_k * operand_k``; build it with ``+``, ``-``, ``*`` by numbers."""

    __slots__ = ("scale", "terms")

    def __init__(self, scale: float = 0.0, terms: tuple[tuple[float, Operand], ...] = ()):
        self.scale = scale
        self.terms = terms

    def __add__(self, other: "Affine") -> "Affine":
        if not isinstance(other, Affine):
            return NotImplemented
        return Affine(self.scale + other.scale, self.terms + other.terms)

    def __sub__(self, other: "Affine") -> "Affine":
        if not isinstance(other, Affine):
            return NotImplemented
        return self + (-1.0) * other

    def __neg__(self) -> "Affine":
        return (-1.0) * self

    def __mul__(self, factor: float) -> "Affine":
        if isinstance(factor, (Affine, Tensor)) or not isinstance(factor, (int, float)):
            return NotImplemented  # a product of two vectors is not affine
        return Affine(factor * self.scale, tuple((factor * c, x) for c, x in self.terms))

    __rmul__ = __mul__

    def __truediv__(self, divisor: float) -> "Affine":
        return self * (1.0 / divisor)

    @property
    def is_direction_alone(self) -> bool:
        """True for the expression ``D`` itself (nothing to compute)."""
        return self.scale == 1 and not self.terms

    @property
    def reads_weights(self) -> bool:
        return any(x is WEIGHTS for _, x in self.terms)

    def __repr__(self) -> str:
        parts = [f"{self.scale}*D"] + [f"{c}*{'W' if x is WEIGHTS else 'v'}" for c, x in self.terms]
        return " + ".join(parts)


#: the direction and the weights as symbols
D = Affine(1.0)
W = Affine(0.0, ((1.0, WEIGHTS),))


def symbol(vector: Tensor) -> Affine:
    """A workspace vector as a symbol."""
    return Affine(0.0, ((1.0, vector),))


def symbolic(workspace: Any) -> Any:
    """The workspace with every tensor replaced by its symbol (dicts, lists and tuples walked; the rest kept)."""
    if isinstance(workspace, Tensor):
        return symbol(workspace)
    if isinstance(workspace, dict):
        return {key: symbolic(value) for key, value in workspace.items()}
    if isinstance(workspace, (list, tuple)):
        return type(workspace)(symbolic(value) for value in workspace)
    return workspace


def evaluate(expression: Affine, direction: Tensor, weights: Callable[[], Tensor], bias_scale: float = 1.0) -> Tensor:
    """The expression on flat vectors: a new vector (``direction`` itself for ``D``); ``weights()`` gives ``w``
    flat and is called only when a term reads it."""
    if expression.is_direction_alone:
        return direction
    out = torch.mul(direction, expression.scale) if expression.scale != 1 else None
    for coefficient, operand in expression.terms:
        vector = weights() if operand is WEIGHTS else operand
        if out is None:
            out = torch.add(direction, vector, alpha=coefficient * bias_scale)
        else:
            out.add_(vector, alpha=coefficient * bias_scale)
    return out


def evaluate_(expression: Affine, grads: list[Tensor], params: list[Tensor],
              views: Callable[[Tensor], list[Tensor]], bias_scale: float = 1.0) -> None:
    """The expression on the per-parameter gradients in place (``D`` = ``grads``, ``W`` = ``params``);
    ``views(flat)`` gives the per-parameter views of a workspace vector."""
    if expression.scale != 1:
        torch._foreach_mul_(grads, expression.scale)
    for coefficient, operand in expression.terms:
        torch._foreach_add_(grads, params if operand is WEIGHTS else views(operand), alpha=coefficient * bias_scale)


def expressions(corrections: Iterable[Any], workspaces: dict[str, Any]) -> list[Affine]:
    """Each correction's formula for this client's workspace, in order."""
    out = []
    for correction in corrections:
        expression = correction.correct(D, W, symbolic(workspaces[correction.name]))
        if not isinstance(expression, Affine):
            raise TypeError(f"{type(correction).__qualname__}.correct must return an expression built from D, W and "
                            f"the workspace's symbols, got {type(expression).__qualname__}.")
        out.append(expression)
    return out
