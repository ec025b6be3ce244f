"""Registries: piece name -> class (with its hyperparameters), preset name -> :class:`AlgorithmSpec`.

A new method costs one small file (a piece with its config, registered with a decorator) plus one preset
line. The registry also knows every piece's hyperparameters: :func:`hyperparameter_fields` merges them
into the flags of ``FedTrainingArguments`` and :func:`piece_hyperparameters` says which flags one piece
reads (model card, checkpoint fingerprint).
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Mapping, TypeVar

# (no import of the piece base classes: algorithms.base re-exports the registration decorators for the piece files)
#: perturbation name -> its ``Perturbation`` subclass
PERTURBATIONS: dict[str, type] = {}
#: correction name -> its ``Correction`` subclass
CORRECTIONS: dict[str, type] = {}
#: server rules (``Aggregator``) and the decentralized mixing rule (gossip, a ``MixingRule``), named alike by presets
AGGREGATORS: dict[str, type] = {}
PRESETS: dict[str, "AlgorithmSpec"] = {}
#: aggregator plug-ins written as a suffix: ``"fedadam+fedgh"`` = FedGH harmonization in front of FedAdam
AGGREGATOR_PLUGINS: dict[str, type] = {}
PLUGIN_SEPARATOR = "+"
#: kind -> registry, for :func:`piece_hyperparameters` (a plug-in's hyperparameters are flags like a piece's)
TABLES = {"perturbation": PERTURBATIONS, "correction": CORRECTIONS, "aggregator": AGGREGATORS,
          "plugin": AGGREGATOR_PLUGINS}

T = TypeVar("T")


def _register(table: dict[str, type], kind: str):
    def decorator(cls: type[T]) -> type[T]:
        if not cls.name:
            raise ValueError(f"{cls.__qualname__} must set a class attribute `name` to be registered as a {kind}.")
        if cls.name in table:
            raise ValueError(f"A {kind} named {cls.name!r} is already registered ({table[cls.name].__qualname__}).")
        config_class = cls.config_class
        if not dataclasses.is_dataclass(config_class):
            raise TypeError(f"{cls.__qualname__}.config_class must be a dataclass (a PieceConfig subclass).")
        _check_consistent(cls, config_class)
        table[cls.name] = cls
        return cls

    return decorator


register_perturbation = _register(PERTURBATIONS, "perturbation")
register_correction = _register(CORRECTIONS, "correction")
register_aggregator = _register(AGGREGATORS, "aggregator")


def registered_pieces(package: str, path: Iterable[str]) -> dict[str, type]:
    """Import every module of the piece package ``package`` (``path``: its ``__path__``), which registers its
    pieces; returns ``{class name: class}`` of every piece (and aggregator plug-in) those modules registered, for the
    package's exports. Modules are imported in name order, so pieces register in the same order on every run."""
    for module in sorted(pkgutil.iter_modules(path), key=lambda m: m.name):
        importlib.import_module(f"{package}.{module.name}")
    return {cls.__name__: cls for table in TABLES.values() for cls in table.values()
            if cls.__module__.startswith(package + ".")}


def _config_types(config_class: type) -> dict[str, Any]:
    return typing.get_type_hints(config_class)


def _registered_configs() -> list[tuple[str, type]]:
    """``(piece name, config class)`` of every registered piece, perturbations, corrections, aggregators, plug-ins."""
    return [(name, cls.config_class) for table in TABLES.values() for name, cls in table.items()]


def _check_consistent(cls: type, config_class: type) -> None:
    """A field of the same name in two pieces must have the same type (it is one flag)."""
    types = _config_types(config_class)
    for other_name, other in _registered_configs():
        other_types = _config_types(other)
        for name, kind in types.items():
            if name in other_types and other_types[name] != kind:
                raise TypeError(f"{cls.__qualname__}: hyperparameter {name!r} is {kind} here but {other_types[name]} "
                                f"in {other_name!r}; one flag needs one type.")


def piece_hyperparameters(kind: str, name: str) -> tuple[str, ...]:
    """The hyperparameters (flag names) the ``kind`` (perturbation, correction, aggregator) ``name`` reads."""
    if kind not in TABLES:
        raise ValueError(f"kind must be one of {tuple(TABLES)}, got {kind!r}.")
    return tuple(f.name for f in dataclasses.fields(TABLES[kind][name].config_class))


def piece_defaults(kind: str, name: str) -> dict[str, Any]:
    """The piece's own default of each of its hyperparameters."""
    return TABLES[kind][name].config_class.defaults()


def hyperparameter_fields() -> list[dataclasses.Field]:
    """One ``dataclasses.Field`` per hyperparameter of all registered pieces, for ``FedTrainingArguments``.

    Every field defaults to ``None`` ("unset": the preset's default, else the piece's own) and is typed
    ``T | None``; its help text is the first declaring piece's, plus the default of every piece declaring it.
    Sorted by name.
    """
    merged: dict[str, dict[str, Any]] = {}
    for piece, config_class in _registered_configs():
        types = _config_types(config_class)
        defaults = config_class.defaults()
        for f in dataclasses.fields(config_class):
            entry = merged.setdefault(f.name, {"type": types[f.name], "help": f.metadata.get("help", ""),
                                               "defaults": {}})
            entry["defaults"][piece] = defaults[f.name]
    fields = []
    for name in sorted(merged):
        entry = merged[name]
        by_value: dict[str, list[str]] = {}
        for piece, value in entry["defaults"].items():
            by_value.setdefault(repr(value), []).append(piece)
        if len(by_value) == 1:
            default_text = f"else {next(iter(by_value))}"
        else:
            default_text = "else the piece's own (" + ", ".join(
                f"{'/'.join(pieces)} {value}" for value, pieces in by_value.items()) + ")"
        help_text = f"{entry['help']} Unset: the preset's default, {default_text}."
        kind = entry["type"]
        base = [a for a in typing.get_args(kind) if a is not type(None)] if type(None) in typing.get_args(kind) else [kind]
        optional = typing.Optional[base[0]]  # typing.Optional, not ``X | None``: what HfArgumentParser reads
        metadata = {"help": help_text}
        if base[0] is bool:  # ``--flag`` alone means true, as for a plain bool field (HfArgumentParser reads these)
            metadata.update(nargs="?", const=True)
        f = dataclasses.field(default=None, metadata=metadata)
        f.name, f.type = name, optional
        fields.append(f)
    return fields


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
        method_fields: the names among ``defaults`` that are this method's point although they are conventions
            for other methods (:data:`~hf_fedflat.algorithms.presets.CONVENTION_FIELDS`: DFedAvgM's momentum,
            D-PSGD's one local step): a comparison that aligns conventions leaves them as they are.
    """

    name: str
    perturbation: str
    corrections: tuple[str, ...]
    aggregator: str
    description: str
    paper: str = ""
    defaults: Mapping[str, Any] = field(default_factory=dict)
    method_fields: tuple[str, ...] = ()


def register_preset(spec: AlgorithmSpec) -> AlgorithmSpec:
    if spec.name in PRESETS:
        raise ValueError(f"An algorithm preset named {spec.name!r} is already registered.")
    PRESETS[spec.name] = spec
    return spec


def list_algorithms() -> list[str]:
    """Names of all registered presets, sorted."""
    return sorted(PRESETS)


def register_aggregator_plugin(cls: type[T]) -> type[T]:
    """Register a wrapper ``cls(base_aggregator, config)`` usable as the suffix ``+<cls.plugin>`` of any aggregator or
    preset; its ``config_class`` fields are flags like a piece's."""
    _check_consistent(cls, cls.config_class)
    AGGREGATOR_PLUGINS[cls.plugin] = cls
    return cls


def split_plugins(name: str) -> tuple[str, tuple[str, ...]]:
    """``"fedlesam_s+fedgh"`` -> ``("fedlesam_s", ("fedgh",))``."""
    base, *plugins = name.split(PLUGIN_SEPARATOR)
    return base, tuple(plugins)


def get_preset(name: str) -> AlgorithmSpec:
    """The preset ``name``; ``"<preset>+<plugin>"`` is the preset with the plug-in added to its aggregator."""
    if not isinstance(name, str):
        raise ValueError(f"fed_algorithm: must be an algorithm's name (text), got {name!r}. Available: "
                         f"{', '.join(list_algorithms())}.")
    base, plugins = split_plugins(name)
    if base not in PRESETS:
        raise ValueError(
            f"fed_algorithm={name!r} is not a known algorithm. Available: {', '.join(list_algorithms())}, "
            f"each optionally with {', '.join(PLUGIN_SEPARATOR + p for p in sorted(AGGREGATOR_PLUGINS))}."
        )
    spec = PRESETS[base]
    for plugin in plugins:
        if plugin not in AGGREGATOR_PLUGINS:
            raise ValueError(
                f"fed_algorithm={name!r}: {plugin!r} is not an aggregator plug-in. Available: "
                f"{', '.join(sorted(AGGREGATOR_PLUGINS))}."
            )
    if not plugins:
        return spec
    existing = split_plugins(spec.aggregator)[1]
    added = "".join(PLUGIN_SEPARATOR + p for p in plugins if p not in existing)
    return dataclasses.replace(spec, name=name, aggregator=spec.aggregator + added)
