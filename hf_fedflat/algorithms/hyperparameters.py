"""Hyperparameters beside their piece: a small config dataclass per piece, validated by the piece.

Every piece declares its hyperparameters as a :class:`PieceConfig` subclass in its own file::

    @dataclass
    class ProxConfig(PieceConfig):
        prox_mu: float = hyperparameter(0.01, "FedProx: weight mu of the proximal term mu*(w - w^t).")

        def validate(self) -> None:
            check_number("prox_mu", self.prox_mu, low=0.0)

Field names are the command-line flags (``--prox_mu``): two pieces reading the same knob (``rho``,
``feddyn_alpha``, ``server_learning_rate``) declare a field of the same name and type, each with its own
default. The registry merges them into the flags of ``FedTrainingArguments``
(:func:`~hf_fedflat.algorithms.registry.hyperparameter_fields`); ``validate`` raises
``ValueError("<field>: <what to do>")``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

# the checks every configuration dataclass shares (their messages start with the field's name)
from ..field_checks import check_choice, check_integer, check_number, fail  # noqa: F401


def hyperparameter(default: Any, help: str) -> Any:
    """A config field with its default and its ``--help`` text."""
    return dataclasses.field(default=default, metadata={"help": help})


@dataclass
class PieceConfig:
    """Base of the pieces' config dataclasses; subclasses add fields and checks."""

    def validate(self) -> None:
        """Raise ``ValueError("<field>: ...")`` for a value the piece cannot use."""

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """``{field: this config's default}``: the piece's own value of each of its hyperparameters."""
        config = cls()
        return {f.name: getattr(config, f.name) for f in dataclasses.fields(cls)}

    @classmethod
    def from_args(cls, args: Any) -> "PieceConfig":
        """This config from any object with the fields as attributes (``FedTrainingArguments``); a missing or
        ``None`` attribute takes this config's default."""
        values = {}
        for f in dataclasses.fields(cls):
            value = getattr(args, f.name, None)
            if value is not None:
                values[f.name] = value
        return cls(**values)
