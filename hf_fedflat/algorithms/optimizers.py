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
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

__all__ = ["OptimizerAssumptionWarning", "check_optimizer_compatibility", "describe_local_optimizer",
           "is_plain_sgd", "plain_sgd_pieces"]


_SGD = "sgd"


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
                f"{used}. Use --optim sgd without momentum in --optim_args, or an algorithm without {piece.name!r} "
                "(e.g. fedavg, fedprox or a SAM-type one work with AdamW)."
            )
        message = (f"{piece.name!r} assumes plain SGD on the clients ({reason}); the local optimizer is {used}, "
                   "so its formula holds only approximately.")
        warnings.warn(message, OptimizerAssumptionWarning, stacklevel=3)
        messages.append(message)
    return messages
