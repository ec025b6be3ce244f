"""The three kinds of pieces an algorithm is composed of, the values they exchange, and all a piece file imports.

An algorithm is ``perturbation x corrections x aggregator`` (see docs/algorithms.md). Pieces hold only
hyperparameters; all state goes in and comes back out explicitly (optax style), so the client-state
store, checkpoints and the multi-process exchange all handle the same plain ``dict[str, Tensor]``.

Client-side pieces (perturbations and corrections) may also own a server half: SCAFFOLD's
correction adds ``lambda*(c - c_i)`` on the client *and* keeps ``c`` on the server. Keeping both
halves in one piece is what lets any correction combine with any aggregator.

A piece file (``perturbations/``, ``corrections/``, ``aggregators/``) imports torch, the standard library and this
module only: the config helpers (``PieceConfig``, ``hyperparameter``, the checks) and the registration decorators
are re-exported here. A perturbation is written as its paper's formula over a :class:`GradientOracle`; what the
step does around it (the non-finite fallback, the device-sync care, preallocated vectors) is the runtime's.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterator, Protocol

import torch

from .affine import Affine
from .hyperparameters import PieceConfig, check_choice, check_integer, check_number, fail, hyperparameter
from .registry import (
    register_aggregator, register_aggregator_plugin, register_correction, register_perturbation, registered_pieces,
)
from .topology import TOPOLOGIES, MixingMatrix, Topology, load_edges

__all__ = [
    # what a piece file needs besides its base class: config, checks, registration, shared constants
    "DELTA_SHIFT", "EPS", "RHO_HELP", "RHO_START_HELP", "RHO_WARMUP_HELP", "SERVER_LEARNING_RATE_HELP", "PieceConfig",
    "Tensor", "StateDict", "check_choice", "check_integer", "check_number", "fail", "global_norm", "ascent_offset",
    "hyperparameter", "ramped_radius", "register_aggregator", "register_aggregator_plugin", "register_correction",
    "register_perturbation", "registered_pieces", "weighted_delta", "weighted_sum",
    # the decentralized mixing rule's graphs
    "TOPOLOGIES", "MixingMatrix", "Topology", "load_edges",
    # the pieces and what they see
    "Aggregator", "AggregatorPlugin", "Capabilities", "ClientContext", "ClientPiece", "ClientUpdate", "Correction",
    "FixedOffsetPerturbation", "GradientOracle", "LocalResult", "LossContext", "LossTerm", "MixingRule", "Perturbation",
    "Piece", "RoundSummary", "SharpnessAware",
]

Tensor = torch.Tensor
StateDict = dict[str, Tensor]


class GradientOracle(Protocol):
    """What :meth:`Perturbation.direction` asks for gradients: ``grad_at``.

    The training step makes one per micro-batch (``hf_fedflat.training.step.StepOracle``); the runtime wraps it with
    the non-finite fallback (``hf_fedflat.runtime.finite_fallback``), so a perturbation writes its formula and nothing
    else: when an offset it asks for is not finite, the step's direction becomes its first pass's gradient (and its
    workspace entries stay as they were), whatever the perturbation does after.

    * ``grad_at(offset)`` -> ``(loss, g)``: one forward and backward pass of the current minibatch at ``w + offset``
      (``None``: at ``w``); ``w`` is left untouched, ``g`` is flat and new (the perturbation may write into it, except
      into its first pass's: that one is the step's fallback).
    * ``grad_at.weights()`` -> ``w``: the current trainable weights, flat (made on the first call of the step, then
      the same tensor; read it, do not write into it).
    * ``grad_at.hessian_vector_product(v)`` -> ``(loss, g, H v)`` at ``w`` by double backward (``v`` None: ``H g``);
      counts as two passes. Needs the step's forward-only loss closure: the step raises a ``TypeError`` without one.
    * ``grad_at.parameter_mask(name_part)`` -> a flat bool vector, True on the entries of the trainable parameters
      whose name contains ``name_part`` (ASAM's ``"weight"``: weight tensors, not biases); built once per run by the
      parameter space, then the same tensor: read it, do not write into it.
    * ``grad_at.bias_scale()`` -> the factor the step's gradients carry besides the loss (loss scale / accumulation
      steps), as a corrections' non-gradient terms get it: a perturbation whose direction adds a vector that is not
      a gradient (FedWMSAM's momentum) multiplies that vector by it.

    Per-step state (SMOO's ``mu_i``) is replaced in the workspace (``workspace["mu"] = mu + e - s``), not written into:
    on a step that falls back the runtime keeps the old entries.
    """

    def __call__(self, offset: Tensor | None) -> tuple[Tensor, Tensor]: ...

    def weights(self) -> Tensor: ...

    def hessian_vector_product(self, vector: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]: ...

    def parameter_mask(self, name_part: str) -> Tensor: ...

    def bias_scale(self) -> float: ...


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
        full_gradient: ``full_gradient()`` -> the gradient of the client's loss over all its data at the weights the
            model holds when called (``w^t`` in :meth:`ClientPiece.begin`), flat, on the training device: one pass
            over the client's data without optimizer step (MimeLite's ``grad f_i(x)``), run only when called. None
            where no data is at hand (a test's context).
    """

    client_id: int
    round: int
    global_params: Tensor
    broadcast: dict[str, StateDict]
    state: dict[str, StateDict]
    learning_rate: float
    num_samples: int
    full_gradient: Callable[[], Tensor] | None = None


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
    #: the client's own ``w_i - w^t`` when a server plug-in (FedGH) replaced ``delta`` by a harmonized one; None:
    #: ``delta`` is the client's own. Server state that mirrors client state (FedDyn's ``H = sum_i h_i``) reads it.
    own_delta: Tensor | None = None

    @property
    def client_delta(self) -> Tensor:
        """The client's own ``w_i - w^t``, whatever plug-in ran in front of the server rule."""
        return self.delta if self.own_delta is None else self.own_delta


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


class Piece:
    """Base of every piece: a name, and its hyperparameters as a :class:`PieceConfig` (``Piece(config)``).

    ``config_class`` declares the hyperparameters (fields named as the command-line flags, with help text,
    defaults and ``validate()``); the registry merges them into ``FedTrainingArguments``. ``run_settings``
    names the run's own settings (not hyperparameters, e.g. ``num_clients``) the constructor also takes, as
    keywords.
    """

    name: ClassVar[str] = ""
    config_class: ClassVar[type[PieceConfig]] = PieceConfig
    run_settings: ClassVar[tuple[str, ...]] = ()

    def __init__(self, config: PieceConfig | None = None):
        self.config = config if config is not None else self.config_class()
        self.config.validate()


class ClientPiece(Piece):
    """Base of perturbations and corrections: optional client state and an optional server half.

    ``client_state_keys``: the keys of the client state its ``end`` returns, each a flat vector like the
    parameters (a resume checks a checkpoint's client states against them, and the run checks every new state).
    ``None``: a piece that keeps no client state (its ``end`` is this one), or one whose keys are checked only
    against each other across clients.
    """

    client_state_keys: ClassVar[tuple[str, ...] | None] = None
    #: its server half reads what each client uploads besides the round's new global model (an update's delta,
    #: steps or messages: SCAFFOLD's control variates, MimeLite's gradients, SMOO's mu_i, the momentum's weighted
    #: mean of the raw updates); a plug-in that releases only a noised mean (``+dp``) refuses such a piece
    server_reads_updates: ClassVar[bool] = False

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

    @abstractmethod
    def direction(self, grad_at: GradientOracle, workspace: Any) -> tuple[Tensor, Tensor]:
        """Returns ``(loss, d)``: the loss to report and the direction of the step as a flat vector."""


class FixedOffsetPerturbation(Perturbation):
    """A step that is one gradient at ``w + e``, the offset ``e`` fixed for the client's round (ERM: none; LESAM).

    The piece gives only :meth:`offset`; its direction is ``grad_at(offset)``. Knowing the offset before the
    pass lets the training step leave the gradient in ``p.grad`` and correct it there in place, and take the
    Trainer's own step when there is neither an offset nor a correction. Being fixed for the round, the offset is
    the piece's to check once, in ``begin`` (LESAM's has no estimate where it is zero or not finite): the step does
    not test it at every pass.
    """

    passes_per_step: ClassVar[int] = 1

    @abstractmethod
    def offset(self, workspace: Any) -> Tensor | None:
        """The client's offset ``e`` for this round (flat), or None: the gradient at ``w`` itself."""

    def direction(self, grad_at: GradientOracle, workspace: Any) -> tuple[Tensor, Tensor]:
        return grad_at(self.offset(workspace))


class SharpnessAware(ABC):
    """A perturbation that steps from an ascent point ``w + e_i`` (SAM-type): it can say which ``e_i`` the client
    would use at ``w^t``, for the perturbation-drift diagnostic ``mean_i ||e_i - e_global||`` (FedLESAM Fig. 2)."""

    @abstractmethod
    def drift_offset(self, workspace: Any, local_gradient: Tensor) -> Tensor | None:
        """This client's ``e_i`` at ``w^t`` given its full local gradient there (None: none this round)."""


#: help text of ``rho``, the radius every SAM-type perturbation declares (each with its own default, which the
#: registry adds to the flag's help)
RHO_HELP = "Perturbation radius rho of the SAM-type steps: the length of the ascent step w -> w + e."
#: help text of ``server_learning_rate``, which several server rules declare
SERVER_LEARNING_RATE_HELP = "Server learning rate eta_g: w <- w + eta_g * sum_i p_i (w_i - w)."


#: help texts of the radius ramp that SAM (``rho``) and FedGloSS's server step (``fedgloss_rho``) share
RHO_START_HELP = "Radius ramp: the radius in round 0, rising linearly to its value over rho_warmup_rounds rounds."
RHO_WARMUP_HELP = ("Radius ramp: rounds T_s over which the radius rises linearly from rho_start to its value "
                   "(FedGloSS); 0 or 1: no ramp.")


def ramped_radius(rho: float, rho_start: float, warmup_rounds: int, round_index: int) -> float:
    """``rho_start + (rho - rho_start) * t / T_s`` in round ``t < T_s``, then ``rho`` (no ramp when ``T_s <= 1``)."""
    if warmup_rounds <= 1 or round_index >= warmup_rounds:
        return rho
    return rho_start + (rho - rho_start) * round_index / warmup_rounds


def ascent_offset(gradient: Tensor, rho: float) -> Tensor:
    """``rho * g / ||g||``: SAM's ascent step for the gradient ``g`` (a new vector)."""
    return gradient * (rho / (global_norm(gradient) + EPS))


class Correction(ClientPiece, ABC):
    """A term applied to the direction before the optimizer step, written once as an affine formula.

    :meth:`correct` receives symbols (see :mod:`hf_fedflat.algorithms.affine`) and returns the corrected
    direction as an expression; the training step evaluates it on flat vectors or on ``p.grad`` in place
    and multiplies every term but ``D`` by the step's ``bias_scale`` (loss scale / accumulation steps).
    """

    @abstractmethod
    def correct(self, D: Affine, W: Affine, ws: Any) -> Affine:
        """The corrected direction.

        Args:
            D: the direction so far.
            W: the current local weights.
            ws: what :meth:`begin` returned for this client, its tensors as symbols.
        """


@dataclass
class LossContext:
    """What a :class:`LossTerm` sees of the current micro-batch besides its model outputs.

    Attributes:
        workspace: what the piece's ``begin`` returned for this client (tensors, not symbols).
        represent_at: ``represent_at(flat_params)`` -> the representation of the same micro-batch at other
            weights (e.g. ``w^t``, MOON's previous local model): an extra forward without gradient, in eval mode
            (no dropout, batch-norm running statistics neither used for training nor updated), shaped like the
            representation.
        inputs: the micro-batch as the model received it (read-only).
        outputs_at: ``outputs_at(flat_params)`` -> the model's outputs (its ``logits`` among them) for the same
            micro-batch at other weights (e.g. FedGMT's moving average of the global models): a forward without
            gradient in eval mode, as for ``represent_at``, the model's own weights untouched. None where no model is
            at hand (a test's context).
    """

    workspace: Any
    represent_at: Callable[[Tensor], Tensor]
    inputs: Any = None
    outputs_at: Callable[[Tensor], Any] | None = None


class LossTerm(Correction):
    """A correction that adds a term to the minibatch loss before backward instead of an affine term to the
    direction (MOON's contrastive term, FedDecorr's decorrelation): its gradient is whatever autograd makes of it.

    The local trainer (``ClientTrainer.compute_loss``) adds ``extra_loss(outputs, representation, ctx)`` to the
    model's loss on every training forward of a client whose algorithm has such a piece, at whatever weights
    the pass runs (a perturbation's ``w + e`` included), so it composes with every perturbation. The
    ``representation`` is the input of the model's classification head for the micro-batch (see
    :mod:`hf_fedflat.models.representation`), pooled to ``(batch, features)``. ``correct`` leaves the direction
    as it is. A run without a loss term never enters this code: its step is unchanged.
    """

    def correct(self, D: Affine, W: Affine, ws: Any) -> Affine:
        return D

    @abstractmethod
    def extra_loss(self, outputs: Any, representation: Tensor, ctx: LossContext) -> Tensor:
        """A scalar added to the micro-batch's loss (same scale as the model's mean loss)."""


#: key of a piece's message whose vector the ``shifted_mean`` aggregator adds to the client's delta
#: (FedDC's drift ``h_i``, FedSpeed's ``-lambda * g_hat_i``): the server averages ``Delta_i + shift_i``.
DELTA_SHIFT = "delta_shift"


@dataclass(frozen=True)
class Capabilities:
    """What the machinery may rely on about an aggregator, where it cannot be read from the code.

    Attributes:
        linear_in_weighted_delta: :meth:`Aggregator.aggregate` reads the updates only through
            ``weighted_delta(updates, weights)``, for any weights (not only ones summing to 1). FedGH in front
            of such a rule passes the recombined weights ``C^T p`` instead of building harmonized updates.
        decentralized: the rule mixes every client's own model with its neighbours' (gossip) instead of
            updating one global model; such a run has no server.
        noised_release: every round's new model is a noised release (client-level differential privacy, ``+dp``):
            the server aggregates even a round in which no update arrived (the noise is that round's release),
            and the run accounts the privacy spent (:meth:`Aggregator.privacy_mechanism`).
    """

    linear_in_weighted_delta: bool = False
    decentralized: bool = False
    noised_release: bool = False


class Aggregator(Piece, ABC):
    """The server rule: new global weights from the clients' updates.

    Besides :meth:`aggregate`, a rule may override three hooks whose defaults leave a run as FedAvg's round has it
    (the server's ``w^t`` is what clients receive, what is evaluated and saved; the round's learning rate is the
    run's): :meth:`broadcast_weights` (FedGloSS sends ``w^t`` shifted by a server ascent step),
    :meth:`client_learning_rate` and :meth:`evaluation_weights` with :meth:`end_round` (SWA's cyclic client
    learning rate and averaged model).
    """

    capabilities: ClassVar[Capabilities] = Capabilities()

    def init_state(self, params: Tensor) -> StateDict:
        return {}

    @abstractmethod
    def aggregate(
        self, params: Tensor, updates: list[ClientUpdate], weights: Tensor, state: StateDict
    ) -> tuple[Tensor, StateDict]:
        """Returns ``(w^{t+1}, new aggregator state)``; ``weights`` are the ``p_i`` (sum to 1). ``params`` is the
        server's ``w^t``; each update's delta is ``w_i`` minus what the client received
        (:meth:`broadcast_weights`)."""

    def begin_round(self, round_index: int, state: StateDict) -> StateDict:
        """State before round ``round_index``'s aggregation (``+dp`` keeps the round it draws its noise for);
        default: unchanged."""
        return state

    def broadcast_weights(self, round_index: int, params: Tensor, state: StateDict) -> Tensor:
        """The weights every client receives and starts round ``round_index`` from, given the server's ``w^t``
        (default: ``w^t`` itself). The clients' ``ctx.global_params`` and deltas are measured from them, while the
        server keeps ``w^t``: :meth:`aggregate` receives ``w^t`` and deltas from the weights sent. Computed on the
        main process only, from ``(round, w^t, state)``: a resumed run sends the same weights."""
        return params

    def client_learning_rate(self, round_index: int, learning_rate: float) -> float:
        """The local learning rate of round ``round_index``, given the run's (``learning_rate *
        lr_decay_per_round^t``; default: that one). A function of the round alone: every process computes it."""
        return learning_rate

    def end_round(self, state: StateDict, summary: RoundSummary) -> StateDict:
        """State after a round that aggregated (``summary.new_params`` is ``w^{t+1}``), for bookkeeping keyed to the
        round (SWA's fold at the end of a cycle); default: unchanged."""
        return state

    def evaluation_weights(self, params: Tensor, state: StateDict) -> Tensor:
        """The weights evaluated and saved as the run's model, given the server's ``w^t`` (default: ``w^t``);
        training and checkpoints continue from ``w^t``."""
        return params

    def sample_clients(self, round_index: int, num_clients: int, clients_per_round: int, seed: int) -> list[int] | None:
        """The clients of round ``round_index`` when the rule samples them itself (``+dp``: Poisson sampling, which
        its accountant assumes); None (default): the run's seeded draw of ``clients_per_round`` clients. A function
        of its arguments alone: every process computes the same list."""
        return None

    def release_update(self, round_index: int, client_id: int, delta: Tensor) -> Tensor:
        """What leaves the client of its update ``delta`` (``w_i`` minus the weights it received), computed in the
        client's own code path after its pieces' ``end`` (``+dp``'s client mode clips and noises it there);
        default: ``delta`` itself."""
        return delta

    def privacy_mechanism(self) -> dict[str, Any] | None:
        """What the run's accountant composes over the rounds (``+dp``: noise multiplier, sampling rate, delta,
        the epsilon budget); None (default): no privacy is claimed."""
        return None

    def check_composition(self, args: Any, client_pieces: list[type]) -> None:
        """Refuse (``ConfigError`` naming the field) a run whose other settings or client pieces this rule cannot
        serve; ``client_pieces`` are the classes of the run's perturbation and corrections. Default: none."""


class AggregatorPlugin(Aggregator):
    """A rule in front of another (``base``), written as a suffix of any aggregator or preset: ``mean+fedgh``.

    Every hook is the base rule's unless the plug-in overrides it, so a plug-in composes with a rule that sends
    other weights (FedGloSS) or keeps state; ``plugin`` is the suffix, and the plug-in's ``name`` the composition's
    (``"mean+fedgh"``). Registered with ``register_aggregator_plugin``; ``run_settings`` as for a piece.
    """

    plugin: ClassVar[str] = ""

    def __init__(self, base: Aggregator, config: PieceConfig | None = None):
        super().__init__(config)
        self.base = base
        self.name = f"{base.name}+{self.plugin}"

    def init_state(self, params: Tensor) -> StateDict:
        return self.base.init_state(params)

    def aggregate(
        self, params: Tensor, updates: list[ClientUpdate], weights: Tensor, state: StateDict
    ) -> tuple[Tensor, StateDict]:
        return self.base.aggregate(params, updates, weights, state)

    def begin_round(self, round_index: int, state: StateDict) -> StateDict:
        return self.base.begin_round(round_index, state)

    def broadcast_weights(self, round_index: int, params: Tensor, state: StateDict) -> Tensor:
        return self.base.broadcast_weights(round_index, params, state)

    def client_learning_rate(self, round_index: int, learning_rate: float) -> float:
        return self.base.client_learning_rate(round_index, learning_rate)

    def end_round(self, state: StateDict, summary: RoundSummary) -> StateDict:
        return self.base.end_round(state, summary)

    def evaluation_weights(self, params: Tensor, state: StateDict) -> Tensor:
        return self.base.evaluation_weights(params, state)

    def sample_clients(self, round_index: int, num_clients: int, clients_per_round: int, seed: int) -> list[int] | None:
        return self.base.sample_clients(round_index, num_clients, clients_per_round, seed)

    def release_update(self, round_index: int, client_id: int, delta: Tensor) -> Tensor:
        return self.base.release_update(round_index, client_id, delta)

    def privacy_mechanism(self) -> dict[str, Any] | None:
        return self.base.privacy_mechanism()

    def check_composition(self, args: Any, client_pieces: list[type]) -> None:
        self.base.check_composition(args, client_pieces)


class MixingRule(Piece, ABC):
    """The decentralized counterpart of an aggregator: no server and no global model; every client's own model
    becomes a weighted average of its neighbours' (gossip). Registered with the aggregators, so presets name it
    like a server rule (``dfedsam`` = ``sam`` x ``gossip``); the decentralized round strategy calls it."""

    capabilities: ClassVar[Capabilities] = Capabilities(decentralized=True)

    @abstractmethod
    def mixing_matrix(self, round_index: int) -> Any:
        """The round's mixing matrix ``W``."""

    @abstractmethod
    def mix(self, matrix: Any, load: Callable[[int], StateDict]) -> Iterator[tuple[int, StateDict]]:
        """``(i, sum_j W_ij z_j)`` for every client ``i``; ``load(j)`` gives ``z_j``."""

    def release_update(self, round_index: int, client_id: int, delta: Tensor) -> Tensor:
        """What leaves the client of its update: all of it (server plug-ins such as ``+dp`` are refused here)."""
        return delta

    def privacy_mechanism(self) -> dict[str, Any] | None:
        """No privacy is claimed for gossip."""
        return None


def weighted_sum(terms: list[Tensor], weights: Tensor) -> Tensor:
    """``sum_i p_i * v_i`` accumulated in place, in the given (deterministic) order."""
    total = torch.zeros_like(terms[0])
    for vector, weight in zip(terms, weights.tolist()):
        total.add_(vector, alpha=weight)
    return total


def weighted_delta(updates: list[ClientUpdate], weights: Tensor) -> Tensor:
    """``sum_i p_i * Delta_i``."""
    return weighted_sum([u.delta for u in updates], weights)
