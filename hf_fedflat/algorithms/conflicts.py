"""Settings that contradict the algorithm, and the name of what actually runs.

A run's algorithm is its preset (``--fed_algorithm``) with the parts given in its place (``--perturbation``,
``--corrections``, ``--aggregator``). :func:`check_algorithm_settings` refuses, with a ``ConfigError`` (a
``ValueError``) that starts with the field's name, what cannot mean what it says:

* an aggregator of the other kind than the preset's: a decentralized preset (gossip: no server) with a server rule,
  or a server preset with gossip. The run would be another kind of algorithm under the preset's name; the message
  spells the same pieces from a preset of the right kind (``--fed_algorithm fedavg --perturbation gam_first_order
  --aggregator fedadam``);
* aggregator plug-ins (``+fedgh``) on a decentralized run: they transform the updates a server aggregates;
* client pieces that keep server state (SCAFFOLD's ``c``, LESAM's last global update) on a decentralized run;
* what the server rule and its plug-ins refuse of the run (``Aggregator.check_composition``: ``+dp`` refuses
  sample-count weights, averaged BatchNorm statistics, a rule behind it that reads more than the mean update and
  client pieces whose server half reads each client's upload), and a noised release (``+dp``) that is not the
  outermost plug-in;
* a setting given explicitly that only pieces of the other kind read: the gossip flags (``topology``,
  ``topology_degree``, ...) and ``decentralized_participation`` on a server run, a server rule's
  (``server_learning_rate``, ``server_beta1``, ...) on a decentralized run.

The kind of a run and of a setting is read from the pieces (an aggregator's ``capabilities.decentralized``, the
config dataclasses that declare a field), never from algorithm names. Any other hyperparameter given explicitly
that no piece of the run reads (``rho`` on ``fedavg``) is warned about once, naming it and the pieces that read it.
"Given" means set by the user: a flag, a config file's key, a field set in Python; a recipe's defaults and its
``--smoke`` list are not (``FedTrainingArguments.restrict_explicit_fields``).

:func:`algorithm_label` names a run as it ran: the preset's name, followed by the parts that differ from the
preset's (``dfedsam (perturbation=gam)``); ``federated_config.json``, the tables of runs and the model card show it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from typing import Any

from ..field_checks import fail
from .base import AggregatorPlugin
from .composed import algorithm_label, build_piece, build_server_rule, resolve_parts
from .registry import (
    AGGREGATOR_PLUGINS, AGGREGATORS, CORRECTIONS, PERTURBATIONS, PRESETS, TABLES, get_preset, split_plugins,
)

__all__ = ["DECENTRALIZED_RUN_FIELDS", "algorithm_label", "check_algorithm_settings"]

logger = logging.getLogger(__name__)

#: fields of the run itself (not of a piece) that only a decentralized run reads (its gossip strategy)
DECENTRALIZED_RUN_FIELDS = ("decentralized_participation", "local_eval_every_n_rounds", "local_eval_clients")
_WARNED: set[str] = set()


def _is_decentralized(aggregator: str) -> bool:
    return bool(AGGREGATORS[split_plugins(aggregator)[0]].capabilities.decentralized)


def _kind(decentralized: bool) -> str:
    return "decentralized" if decentralized else "server"


def _presets_of_kind(decentralized: bool) -> list[str]:
    return [name for name, spec in PRESETS.items() if _is_decentralized(spec.aggregator) == decentralized]


def _spelled_from_preset(decentralized: bool, perturbation: str, corrections: tuple[str, ...],
                         aggregator: str) -> str | None:
    """The flags that give these pieces from the plainest preset of that kind (no perturbation, correction or
    plug-in: fedavg, dfedavg), or None when there is none."""
    plain = next((name for name in _presets_of_kind(decentralized)
                  if PRESETS[name].perturbation == "none" and not PRESETS[name].corrections
                  and not split_plugins(PRESETS[name].aggregator)[1]), None)
    if plain is None:
        return None
    spec = PRESETS[plain]
    flags = [f"--fed_algorithm {plain}"]
    if perturbation != spec.perturbation:
        flags.append(f"--perturbation {perturbation}")
    if tuple(corrections) != tuple(spec.corrections):
        flags.append(f"--corrections {','.join(corrections) or repr('')}")
    if aggregator != spec.aggregator:
        flags.append(f"--aggregator {aggregator}")
    return " ".join(flags)


def _readers(name: str) -> list[tuple[str, str, type]]:
    """``(kind, piece name, class)`` of every registered piece whose config declares the field ``name``."""
    return [(kind, piece, cls) for kind, table in TABLES.items() for piece, cls in table.items()
            if name in {f.name for f in dataclasses.fields(cls.config_class)}]


def _readers_text(names: Iterable[str]) -> str:
    """``"prox_mu is read by the correction prox; rho by the perturbations sam, gam, ..."``."""
    texts = []
    for name in names:
        if name in DECENTRALIZED_RUN_FIELDS:
            texts.append(f"{name} by the decentralized round itself")
            continue
        by_kind: dict[str, list[str]] = {}
        for kind, piece, _ in _readers(name):
            by_kind.setdefault(kind, []).append(piece)
        kinds = [f"the {kind}{'s' if len(pieces) > 1 else ''} {', '.join(pieces)}" for kind, pieces in by_kind.items()]
        texts.append(f"{name} by {' and '.join(kinds) or 'no piece'}")
    return "; ".join(texts).replace(" by ", " is read by ", 1)


def _field_kind(name: str) -> bool | None:
    """True: only decentralized pieces (or a decentralized run) read ``name``; False: only server rules and their
    plug-ins; None: a client piece reads it, or no piece (it belongs to no kind)."""
    if name in DECENTRALIZED_RUN_FIELDS:
        return True
    readers = _readers(name)
    if not readers or any(kind in ("perturbation", "correction") for kind, _, _ in readers):
        return None
    kinds = {kind == "aggregator" and bool(cls.capabilities.decentralized) for kind, _, cls in readers}
    return kinds.pop() if len(kinds) == 1 else None


def _has_server_half(cls: type, args: Any) -> bool:
    import torch

    return bool(build_piece(cls, args).init_server_state(torch.zeros(1)))


def _check_server_rule(args: Any, aggregator: str, perturbation: str, corrections: tuple[str, ...]) -> None:
    """What the server rule and its plug-ins refuse of the run (``Aggregator.check_composition``); and a noised
    release (``+dp``) must be the outermost plug-in: a rule in front of it would read the clients' own updates."""
    server_rule = build_server_rule(aggregator, args)
    inner = server_rule
    while isinstance(inner, AggregatorPlugin):
        inner = inner.base
        if inner.capabilities.noised_release:
            field = "aggregator" if getattr(args, "aggregator", None) is not None else "fed_algorithm"
            fail(field, f"{aggregator}: +{inner.plugin} releases a noised mean and must be the last plug-in, or the "
                 f"rules in front of it read the clients' own updates; move +{inner.plugin} to the end.")
    server_rule.check_composition(args, [PERTURBATIONS[perturbation], *(CORRECTIONS[name] for name in corrections)])


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        logger.warning(message)


def check_algorithm_settings(args: Any, explicit: Iterable[str] | None = None, also_read: Iterable[str] = ()) -> None:
    """Refuse the settings of ``args`` that contradict its algorithm and warn about the ones no piece reads (see
    the module docstring).

    Args:
        args: a ``FedTrainingArguments`` or any object with its fields as attributes.
        explicit: the fields the user set (a hyperparameter left unset is ``None`` before the preset's and the
            pieces' defaults fill it in); None: not known, only the pieces are checked.
        also_read: fields the run reads besides its pieces (``rho``, the radius of the ``sharpness`` diagnostic).
    """
    fed_algorithm = args.fed_algorithm
    spec = get_preset(fed_algorithm)
    perturbation, corrections, aggregator = resolve_parts(
        fed_algorithm, getattr(args, "perturbation", None), getattr(args, "corrections", None),
        getattr(args, "aggregator", None))
    base, plugins = split_plugins(aggregator)
    decentralized = _is_decentralized(aggregator)
    if decentralized != _is_decentralized(spec.aggregator):
        spelled = _spelled_from_preset(decentralized, perturbation, corrections, aggregator)
        how = (f"; for a {_kind(decentralized)} run of these pieces, start from a {_kind(decentralized)} preset: "
               f"{spelled}" if spelled else "")
        what = ("is decentralized (gossip: no server, every client keeps its own model)" if decentralized
                else "updates a global model on a server")
        fail("aggregator", f"{base!r} {what}, but fed_algorithm {fed_algorithm!r} is a {_kind(not decentralized)} "
             f"algorithm (aggregator {split_plugins(spec.aggregator)[0]!r}){how}.")
    if decentralized and plugins:
        field = "aggregator" if getattr(args, "aggregator", None) is not None else "fed_algorithm"
        fail(field, f"the plug-in(s) {', '.join('+' + p for p in plugins)} transform the updates a server aggregates "
             f"and do not apply to {base!r} (decentralized: no server); drop them from {field}.")
    if decentralized:
        for field, names, table in (("perturbation", (perturbation,), PERTURBATIONS),
                                    ("corrections", corrections, CORRECTIONS)):
            kept = [name for name in names if _has_server_half(table[name], args)]
            if kept:
                fail(field, f"{', '.join(kept)} needs server-side state, and a decentralized run has no server. Choose "
                     "pieces without a server half (e.g. perturbation none/sam/gam, correction prox) or a server "
                     "preset.")
    if not decentralized:
        _check_server_rule(args, aggregator, perturbation, corrections)
    if explicit is None:
        return
    pieces = [PERTURBATIONS[perturbation], *(CORRECTIONS[name] for name in corrections), AGGREGATORS[base],
              *(AGGREGATOR_PLUGINS[name] for name in plugins)]
    read = {f.name for piece in pieces for f in dataclasses.fields(piece.config_class)} | set(also_read)
    if decentralized:
        read |= set(DECENTRALIZED_RUN_FIELDS)
    unread = [name for name in explicit if name not in read]
    label = algorithm_label(fed_algorithm, getattr(args, "perturbation", None), getattr(args, "corrections", None),
                            getattr(args, "aggregator", None))
    other_kind = [name for name in unread if _field_kind(name) is (not decentralized)]
    if other_kind:
        them = "it is a setting" if len(other_kind) == 1 else "they are settings"
        examples = ", ".join(_presets_of_kind(not decentralized)[:5])
        run = (f"is decentralized (aggregator {base!r}: no server)" if decentralized
               else f"has a server (aggregator {base!r}) and no gossip")
        drop = "it" if len(other_kind) == 1 else "them"
        fail(", ".join(other_kind), f"given, but {them} of {_kind(not decentralized)} runs "
             f"({_readers_text(other_kind)}) and {label} {run}; drop {drop}, or pick a "
             f"{_kind(not decentralized)} preset ({examples}, ...).")
    if unread:
        given = ", ".join(f"{name}={getattr(args, name, None)!r}" for name in unread)
        readers = _readers_text(unread)
        _warn_once(f"{', '.join(unread)}: given ({given}), but no piece of {label} reads "
                   f"{'it' if len(unread) == 1 else 'them'} (perturbation {perturbation}, corrections "
                   f"{','.join(corrections) or 'none'}, aggregator {aggregator}): no effect on this run ({readers}).")
