"""Registries: piece name -> class, preset name -> :class:`AlgorithmSpec`.

A new method costs one small file (a piece registered with a decorator) plus one preset line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, TypeVar

from .base import Aggregator, Correction, Perturbation

PERTURBATIONS: dict[str, type[Perturbation]] = {}
CORRECTIONS: dict[str, type[Correction]] = {}
AGGREGATORS: dict[str, type[Aggregator]] = {}
PRESETS: dict[str, "AlgorithmSpec"] = {}

T = TypeVar("T")


def _register(table: dict[str, type], kind: str):
    def decorator(cls: type[T]) -> type[T]:
        if not cls.name:
            raise ValueError(f"{cls.__qualname__} must set a class attribute `name` to be registered as a {kind}.")
        if cls.name in table:
            raise ValueError(f"A {kind} named {cls.name!r} is already registered ({table[cls.name].__qualname__}).")
        table[cls.name] = cls
        return cls

    return decorator


register_perturbation = _register(PERTURBATIONS, "perturbation")
register_correction = _register(CORRECTIONS, "correction")
register_aggregator = _register(AGGREGATORS, "aggregator")


@dataclass(frozen=True)
class AlgorithmSpec:
    """A named algorithm: a preset of the three parts.

    Attributes:
        name: what users type (``--fed_algorithm fedgamma``).
        perturbation: a key of :data:`PERTURBATIONS`.
        corrections: keys of :data:`CORRECTIONS`, applied in order.
        aggregator: a key of :data:`AGGREGATORS`.
        description: one line for listings and model cards.
        paper: the reference.
        defaults: hyperparameter defaults of this preset (field name of ``FedTrainingArguments`` -> value),
            used where the user left the field unset.
    """

    name: str
    perturbation: str
    corrections: tuple[str, ...]
    aggregator: str
    description: str
    paper: str = ""
    defaults: Mapping[str, Any] = field(default_factory=dict)


def register_preset(spec: AlgorithmSpec) -> AlgorithmSpec:
    if spec.name in PRESETS:
        raise ValueError(f"An algorithm preset named {spec.name!r} is already registered.")
    PRESETS[spec.name] = spec
    return spec


def list_algorithms() -> list[str]:
    """Names of all registered presets, sorted."""
    return sorted(PRESETS)


def get_preset(name: str) -> AlgorithmSpec:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(
            f"fed_algorithm={name!r} is not a known algorithm. Available: {', '.join(list_algorithms())}."
        ) from None
