"""The three kinds of pieces an algorithm is composed of, and the values they exchange.

An algorithm is ``perturbation x corrections x aggregator`` (see ALGORITHMS.md). Pieces hold only
hyperparameters; all state goes in and comes back out explicitly (optax style), so the client-state
store, checkpoints and the multi-process exchange all handle the same plain ``dict[str, Tensor]``.

Client-side pieces (perturbations and corrections) may also own a server half: SCAFFOLD's
correction adds ``lambda*(c - c_i)`` on the client *and* keeps ``c`` on the server. Keeping both
halves in one piece is what lets any correction combine with any aggregator.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import torch

from .. import vectors

Tensor = torch.Tensor
StateDict = dict[str, Tensor]
#: ``grad_at(offset)`` -> ``(loss, flat_grad)`` of the current minibatch at ``w + offset`` (``None``: at ``w``).
GradFn = Callable[[Tensor | None], tuple[Tensor, Tensor]]

EPS = 1e-12


def global_norm(vector: Tensor) -> Tensor:
    """L2 norm over the concatenation of all trainable parameters (one norm, not per layer)."""
    return torch.linalg.vector_norm(vector)


@dataclass
class ClientContext:
    """What a client piece may read when a client starts its local round.

    Attributes:
        client_id: id of the client in ``[0, num_clients)``.
        round: the round index ``t`` (0-based).
        global_params: ``w^t`` as a flat vector on the training device.
        broadcast: per piece name, what the server sends every client this round (e.g. SCAFFOLD's ``c``).
        state: per piece name, this client's stored state (empty the first time the client takes part).
        learning_rate: the round's local learning rate ``eta_t``.
        num_samples: ``n_i``.
    """

    client_id: int
    round: int
    global_params: Tensor
    broadcast: dict[str, StateDict]
    state: dict[str, StateDict]
    learning_rate: float
    num_samples: int


class LocalResult:
    """The outcome of local training, seen by the pieces' ``end`` hooks.

    Attributes:
        params: ``w_i``, flat, training device. Built on first access when given as a function: no piece
            of this package reads it (they read ``delta``), and a flat copy of the weights is a pass over
            the model per client.
        num_steps: ``K``, the optimizer steps actually taken.
        delta: ``w_i - w^t``, flat, training device: computed once per client, read by the pieces
            (SCAFFOLD's ``dc_i``, FedDyn's ``h_i``) and sent as the update's delta, so no piece repeats the
            subtraction.
    """

    def __init__(self, params: Tensor | Callable[[], Tensor], num_steps: int, delta: Tensor):
        self._params = params
        self.num_steps = num_steps
        self.delta = delta

    @property
    def params(self) -> Tensor:
        if callable(self._params):
            self._params = self._params()
        return self._params


@dataclass
class ClientUpdate:
    """What one client sends to the server after its round.

    ``messages`` are per-piece tensors for the server half (e.g. SCAFFOLD's ``dc_i``); ``state`` is the
    client's new per-piece state, written back to the client-state store by the main process.
    """

    client_id: int
    num_samples: int
    num_steps: int
    train_loss: float
    delta: Tensor  # w_i - w^t, flat, CPU
    messages: dict[str, StateDict] = field(default_factory=dict)
    state: dict[str, StateDict] = field(default_factory=dict)
    #: floating buffers after local training (only with ``batchnorm_buffers="average"``)
    buffers: Tensor | None = None
    #: wall time of the client's local round (balances later rounds across processes)
    train_seconds: float = 0.0


@dataclass
class RoundSummary:
    """What server halves see after aggregation."""

    round: int
    old_params: Tensor
    new_params: Tensor
    updates: list[ClientUpdate]
    weights: Tensor  # aggregation weights p_i, same order as updates
    num_clients: int  # N, all clients
    learning_rate: float = 0.0  # the round's local learning rate eta_t


class ClientPiece:
    """Base of perturbations and corrections: optional client state and an optional server half."""

    name: ClassVar[str] = ""

    def begin(self, ctx: ClientContext) -> Any:
        """Called once per client per round before local training; returns this piece's workspace."""
        return None

    def end(self, ctx: ClientContext, workspace: Any, result: LocalResult) -> tuple[StateDict | None, StateDict]:
        """Called after local training: ``(new client state or None, message to the server)``."""
        return None, {}

    def init_server_state(self, params: Tensor) -> StateDict:
        """Server-side state of this piece, created once from the initial global params."""
        return {}

    def broadcast(self, server_state: StateDict) -> StateDict:
        """The part of the server state every client receives each round."""
        return server_state

    def update_server_state(self, server_state: StateDict, summary: RoundSummary) -> StateDict:
        """Server half: new server state after the round's aggregation."""
        return server_state


class Perturbation(ClientPiece, ABC):
    """How the direction of one optimizer step is obtained from (possibly several) gradient passes."""

    #: forward+backward passes per optimizer step (reported in comparisons, checked in tests)
    passes_per_step: ClassVar[int] = 1
    #: True only for the plain gradient: lets the Trainer take its ordinary step untouched.
    is_identity: ClassVar[bool] = False

    @abstractmethod
    def direction(self, grad_at: GradFn, workspace: Any) -> tuple[Tensor, Tensor]:
        """Returns ``(loss, d)``: the loss to report and the direction of the step as a flat vector."""

    def fixed_offset(self, workspace: Any) -> Tensor | None:
        """Perturbations whose direction is one gradient at ``w + offset``, the offset fixed for the client's
        round, implement this (None: at ``w``); the training step can then leave the gradient in ``p.grad``
        (no flat copy)."""
        raise NotImplementedError

    @property
    def single_fixed_pass(self) -> bool:
        """Whether :meth:`fixed_offset` is implemented."""
        return type(self).fixed_offset is not Perturbation.fixed_offset

    def offset_estimate(self, workspace: Any, local_gradient: Tensor) -> Tensor | None:
        """The perturbation ``e_i`` this client would apply at ``w^t`` given its full local gradient there
        (for the perturbation-drift diagnostic); None for perturbations without one."""
        rho = getattr(self, "rho", None)
        if rho is None:
            return None
        return local_gradient * (rho / (global_norm(local_gradient) + EPS))


class Correction(ClientPiece, ABC):
    """A term applied to the direction before the optimizer step (affine in the direction)."""

    #: whether ``apply`` reads the current weights (``params``); if not, it receives ``None``
    uses_params: ClassVar[bool] = True
    @property
    def applies_in_place(self) -> bool:
        """Whether :meth:`apply_to_grads_` is implemented."""
        return type(self).apply_to_grads_ is not Correction.apply_to_grads_

    def apply_to_grads_(self, grads: list[Tensor], params: list[Tensor] | None, workspace: Any,
                        split: Callable[[Tensor], list[Tensor]], bias_scale: float = 1.0) -> None:
        """:meth:`apply` on the per-parameter gradients in place: the same elementwise operations in the same
        order, so the result is bit-identical to the flat one (tested), without flattening ``g`` and ``w``
        every step. ``params`` are the parameters themselves; ``split(flat)`` gives the per-parameter views
        of a vector of the workspace (made once per client: pass it vectors fixed for the round, not
        temporaries)."""
        raise NotImplementedError

    @abstractmethod
    def apply(self, direction: Tensor, params: Tensor | None, workspace: Any, bias_scale: float = 1.0) -> Tensor:
        """Returns the corrected direction.

        Args:
            direction: the current direction ``d`` (flat).
            params: the current local weights ``w`` (flat); ``None`` when ``uses_params`` is False.
            workspace: what ``begin`` returned for this client and round.
            bias_scale: factor for the terms that do not come from the minibatch gradient. With gradient
                accumulation over M micro-batches (and a loss scale S under fp16) those terms must be
                added once per optimizer step, so each micro-batch adds them times ``S / M``.
        """


class Aggregator(ABC):
    """The server rule: new global weights from the clients' updates."""

    name: ClassVar[str] = ""
    #: True when :meth:`aggregate` reads the updates only through ``weighted_delta(updates, weights)`` (for
    #: any weights, not only ones that sum to 1): plug-ins that recombine updates linearly may then pass
    #: recombined weights instead of recombined updates
    linear_in_weighted_delta: ClassVar[bool] = False

    def init_state(self, params: Tensor) -> StateDict:
        return {}

    @abstractmethod
    def aggregate(
        self, params: Tensor, updates: list[ClientUpdate], weights: Tensor, state: StateDict
    ) -> tuple[Tensor, StateDict]:
        """Returns ``(w^{t+1}, new aggregator state)``; ``weights`` are the ``p_i`` (sum to 1)."""


def weighted_sum(terms: list[Tensor], weights: Tensor) -> Tensor:
    """``sum_i p_i * v_i`` accumulated in place, in the given (deterministic) order."""
    total = vectors.zeros_like(terms[0])
    for vector, weight in zip(terms, weights.tolist()):
        total.add_(vector, alpha=weight)
    return total


def weighted_delta(updates: list[ClientUpdate], weights: Tensor) -> Tensor:
    """``sum_i p_i * Delta_i``."""
    return weighted_sum([u.delta for u in updates], weights)
