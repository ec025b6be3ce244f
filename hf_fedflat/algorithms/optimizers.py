"""Which local optimizer a piece's formulas assume, checked before training.

Some pieces turn a client's displacement back into gradients by dividing by ``K * eta`` (SCAFFOLD's control
variates, the MoFedSAM/FedCM momentum), weight clients by their step count (FedNova's normalizer) or take the
local learning rate as a step size in their formula (FedUp); FedDyn's dynamic regulariser and its state update
are derived for a plain-SGD local solver. These identities hold for plain SGD (``optim="sgd"`` without momentum)
only. A piece declares it with class attributes::

    assumes_plain_sgd = True
    plain_sgd_policy = "error"      # or "warn"
    plain_sgd_reason = "c_i+ = c_i - c + (w^t - w_i)/(K eta) is the mean local gradient only for plain SGD"

:func:`check_optimizer_compatibility` (called by ``FedTrainingArguments`` validation) refuses a run that pairs an
``"error"`` piece with another optimizer or with SGD momentum/Nesterov, and warns (:class:`OptimizerAssumptionWarning`)
for a ``"warn"`` piece. The policies and their evidence are listed in the README ("Optimizer compatibility").

:func:`resolve_local_optimizer` fills ``optim`` and ``learning_rate`` when the user left them unset: the papers' plain
SGD at 0.01 for the built-in models, the Trainer's AdamW at 5e-5 (LoRA: 2e-4) for transformers and timm models, and
plain SGD whatever the model for an algorithm with a piece that assumes it (docs/configuration.md, "Local optimizer
and learning rate").
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any, NamedTuple

__all__ = ["LORA_LEARNING_RATE", "LocalOptimizer", "OptimizerAssumptionWarning", "PAPERS_LEARNING_RATE",
           "PAPERS_OPTIMIZER", "TRAINER_LEARNING_RATE", "TRAINER_OPTIMIZER", "check_optimizer_compatibility",
           "describe_local_optimizer", "is_plain_sgd", "plain_sgd_pieces", "plain_sgd_presets",
           "resolve_local_optimizer"]


_SGD = "sgd"
#: the federated papers' local optimizer and rate: the built-in models' (small CNN, LSTMs) when left unset
PAPERS_OPTIMIZER, PAPERS_LEARNING_RATE = _SGD, 0.01
#: what ``transformers.Trainer`` gives a transformers user: AdamW (torch) at 5e-5 for full fine-tuning
TRAINER_OPTIMIZER, TRAINER_LEARNING_RATE = "adamw_torch", 5e-5
#: AdamW's rate for LoRA adapters: a zero-initialised low-rank update moves little at 5e-5 (peft's and QLoRA's
#: examples train adapters at 1e-4 to 2e-4; the LLM LoRA recipe uses 2e-4)
LORA_LEARNING_RATE = 2e-4


class OptimizerAssumptionWarning(UserWarning):
    """A piece of the run assumes plain SGD and the local optimizer is not plain SGD."""


def _optim_args(value: Any) -> dict[str, str]:
    """``optim_args`` (``"momentum=0.9,nesterov=True"``) as a dict, as transformers parses it."""
    if not value:
        return {}
    if isinstance(value, dict):
        return {str(k): str(v) for k, v in value.items()}
    pairs = [item.split("=", 1) for item in str(value).replace(" ", "").split(",") if item]
    return {key: val for key, val in (p if len(p) == 2 else (p[0], "") for p in pairs)}


def describe_local_optimizer(optim: Any, optim_args: Any) -> str:
    """``"sgd"``, ``"sgd with momentum=0.9"``, ``"adamw_torch"``: the optimizer as the messages name it."""
    name = str(getattr(optim, "value", optim))
    extra = _optim_args(optim_args)
    if name == _SGD:
        parts = [f"{k}={extra[k]}" for k in ("momentum", "nesterov", "dampening") if k in extra]
        return name + (" with " + ", ".join(parts) if parts else "")
    return name


def is_plain_sgd(optim: Any, optim_args: Any) -> bool:
    """Whether the local optimizer is SGD without momentum (the Trainer's ``optim="sgd"``, no momentum in
    ``optim_args``). Weight decay is allowed: it is a gradient term the identities carry along."""
    if str(getattr(optim, "value", optim)) != _SGD:
        return False
    extra = _optim_args(optim_args)
    try:
        momentum = float(extra.get("momentum", 0.0) or 0.0)
    except ValueError:
        return False
    return momentum == 0.0 and extra.get("nesterov", "false").lower() not in ("true", "1", "yes")


def plain_sgd_pieces(pieces: Iterable[type]) -> list[type]:
    """The pieces among ``pieces`` that declare ``assumes_plain_sgd``."""
    return [piece for piece in pieces if getattr(piece, "assumes_plain_sgd", False)]


def check_optimizer_compatibility(pieces: Iterable[type], optim: Any, optim_args: Any = None) -> list[str]:
    """Refuse or warn when a piece assuming plain SGD meets another local optimizer.

    Args:
        pieces: the run's piece classes (``FedTrainingArguments.active_pieces()``).
        optim, optim_args: the Trainer's ``optim`` and ``optim_args``.

    Returns:
        The warning messages emitted (``OptimizerAssumptionWarning``), one per ``"warn"`` piece.

    Raises:
        ValueError: An ``"error"`` piece with another optimizer; the message starts with ``optim:``, names the piece,
            its reason, and what to do.
    """
    if is_plain_sgd(optim, optim_args):
        return []
    used = describe_local_optimizer(optim, optim_args)
    messages = []
    for piece in dict.fromkeys(plain_sgd_pieces(pieces)):  # a piece registered twice (feddyn) once
        reason = getattr(piece, "plain_sgd_reason", "its formulas assume plain SGD")
        policy = getattr(piece, "plain_sgd_policy", "error")
        if policy == "error":
            raise ValueError(
                f"optim: {piece.name!r} assumes plain SGD on the clients ({reason}), but the local optimizer is "
                f"{used}. Use --optim sgd without momentum in --optim_args (left unset, optim is sgd for this "
                f"algorithm, transformers models included), or an algorithm without {piece.name!r} (e.g. fedavg, "
                "fedprox or a SAM-type one work with AdamW)."
            )
        message = (f"{piece.name!r} assumes plain SGD on the clients ({reason}); the local optimizer is {used}, "
                   "so its formula holds only approximately.")
        warnings.warn(message, OptimizerAssumptionWarning, stacklevel=3)
        messages.append(message)
    return messages


def plain_sgd_presets() -> list[str]:
    """The registered presets with a piece that assumes plain SGD (they keep ``sgd`` when ``optim`` is unset)."""
    from .composed import resolve_parts
    from .registry import AGGREGATORS, CORRECTIONS, PERTURBATIONS, list_algorithms, split_plugins

    names = []
    for name in list_algorithms():
        perturbation, corrections, aggregator = resolve_parts(name, None, None, None)
        pieces = [PERTURBATIONS[perturbation], *(CORRECTIONS[c] for c in corrections),
                  AGGREGATORS[split_plugins(aggregator)[0]]]
        if plain_sgd_pieces(pieces):
            names.append(name)
    return names


class LocalOptimizer(NamedTuple):
    """The local optimizer a run uses, and where its unset values came from."""

    optim: str
    learning_rate: float
    #: a few words per value filled in (``""`` when both were given)
    note: str = ""
    #: the pieces for which an unset optim stayed sgd on a trainer-conventions model (they assume plain SGD)
    kept_sgd_for: tuple[str, ...] = ()


def resolve_local_optimizer(optim: Any, learning_rate: float | None, *, trainer_conventions: bool,
                            use_lora: bool = False, pieces: Iterable[type] = ()) -> LocalOptimizer:
    """``optim`` and ``learning_rate`` with the unset ones (``None``) filled in for the model and the algorithm.

    Args:
        optim, learning_rate: what the user gave; ``None`` = not given (on the command line, in the config file
            or as a keyword).
        trainer_conventions: the model is a transformers model (``--model_name_or_path``) or a timm model given
            by name, trained the way a transformers user expects; False for the built-in models (small CNN,
            ResNet-18-GN, LSTMs), trained as in the federated papers.
        use_lora: LoRA adapters are trained (a higher AdamW rate).
        pieces: the run's piece classes; one that assumes plain SGD keeps ``sgd`` for an unset ``optim``.

    Returns:
        :class:`LocalOptimizer`. An unset ``optim`` is ``adamw_torch`` with ``trainer_conventions`` (unless a piece
        assumes plain SGD), else ``sgd``. An unset ``learning_rate`` follows the optimizer: 0.01 for SGD (the
        papers'), and for another optimizer on a trainer-conventions model the Trainer's 5e-5 (LoRA: 2e-4); the
        built-in models keep 0.01.
    """
    notes, kept = [], ()
    if optim is None:
        sgd_pieces = list(dict.fromkeys(plain_sgd_pieces(pieces)))
        if trainer_conventions and sgd_pieces:
            optim = PAPERS_OPTIMIZER
            kept = tuple(piece.name for piece in sgd_pieces)
            notes.append(f"optim sgd, not the AdamW of transformers models: {', '.join(kept)} assumes plain SGD")
        elif trainer_conventions:
            optim = TRAINER_OPTIMIZER
            notes.append("optim adamw_torch: the Trainer's, for transformers and timm models")
        else:
            optim = PAPERS_OPTIMIZER
            notes.append("optim sgd: the papers', for the built-in models")
    if learning_rate is None:
        if trainer_conventions and str(getattr(optim, "value", optim)) != _SGD:
            learning_rate = LORA_LEARNING_RATE if use_lora else TRAINER_LEARNING_RATE
            notes.append(f"learning_rate {learning_rate:g}: " + ("a LoRA rate" if use_lora else "the Trainer's"))
        else:
            learning_rate = PAPERS_LEARNING_RATE
            notes.append(f"learning_rate {learning_rate:g}: the papers' "
                         + ("SGD rate" if str(getattr(optim, "value", optim)) == _SGD else "rate, for the built-in models"))
    return LocalOptimizer(str(getattr(optim, "value", optim)), learning_rate, "; ".join(notes), kept)
