"""Tables whose members differ only in their methods: the conventions a comparison aligns.

Each preset takes its own paper's conventions where the user sets nothing: FedGAM averages the updates uniformly,
FedAvg by sample counts. A table of presets run that way compares the conventions along with the methods (on real
MNIST, FedGAM - FedAvg is -0.049 with each preset's own weights and +0.0003 with both uniform). In the papers the
baselines ran inside the same framework as the proposed method; so does a comparison here, by default.

What is a convention is data, declared next to the presets: ``CONVENTION_FIELDS`` in
:mod:`hf_fedflat.algorithms.presets` (aggregation weights, the server's control-variate average, local work,
learning rate and its decay, weight decay, momentum, ...); a preset whose method *is* one of them names it in
its ``method_fields`` (DFedAvgM's momentum, D-PSGD's single local step) and keeps it. Everything else a preset
sets (``rho``, ``server_learning_rate``, ...) is its method's and is never touched.

The rule (``conventions: aligned``, the default): for each convention, among the members that read it (a piece's
hyperparameter is read by the members whose pieces declare it, ``decentralized_participation`` by the decentralized
members, a setting of the run by every member) and do not count it as their method, the **reference member's**
value wins: the sweep's ``baseline``, else the first member that reads it (a comparison's first algorithm). A
member whose value came from its preset's or its pieces' defaults takes it; a value set for one member alone (a
sweep entry's field or grid) is kept, and that member is **flagged** in the table and its header, as is every
differing member under ``conventions: per_method`` (each member with its own paper's conventions). A setting given
for every member (a flag, the sweep's ``base:``) is the same for all already and wins.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CONVENTION_MODES", "ConventionReport", "MemberConventions", "check_convention_mode", "member_conventions",
           "plan_alignment", "recorded_conventions"]

#: ``aligned`` (default): one value of each convention for every member; ``per_method``: each preset's own
CONVENTION_MODES = ("aligned", "per_method")
#: the mark of a row whose member differs from the reference in more than its method
FLAG = "†"
#: members named per line of the summary (all of them are in its JSON)
SHOWN = 6


def check_convention_mode(field_name: str, value: Any) -> str:
    """``value`` if it is a mode of :data:`CONVENTION_MODES`; else ``ValueError("<field_name>: ...")``."""
    if value not in CONVENTION_MODES:
        raise ValueError(f"{field_name}: must be 'aligned' (every member with the first member's / the baseline's "
                         "conventions, so that they differ only in their methods) or 'per_method' (each with its own "
                         f"paper's), got {value!r}.")
    return value


def convention_fields() -> dict[str, str]:
    """``{field: what it is}`` of every convention (:data:`hf_fedflat.algorithms.presets.CONVENTION_FIELDS`)."""
    from ..algorithms.presets import CONVENTION_FIELDS

    return dict(CONVENTION_FIELDS)


@dataclass(frozen=True)
class MemberConventions:
    """One member's conventions: ``values`` of every convention it reads, the ones it did not set itself
    (``defaulted``: its preset's, its pieces' or the run's default) and its preset's ``method_fields``."""

    name: str
    values: Mapping[str, Any]
    defaulted: frozenset[str] = frozenset()
    method_fields: frozenset[str] = frozenset()


def _reads(args, name: str, piece_fields: set[str], decentralized: bool) -> bool:
    from ..algorithms.conflicts import DECENTRALIZED_RUN_FIELDS

    if name in DECENTRALIZED_RUN_FIELDS:
        return decentralized
    if name in piece_fields:  # a piece's hyperparameter: read only where one of the member's pieces declares it
        return name in args.algorithm_hyperparameters()
    return hasattr(args, name)  # a setting of the run: every member reads it


def member_conventions(name: str, args) -> MemberConventions:
    """:class:`MemberConventions` of a member's resolved ``FedTrainingArguments``."""
    from ..algorithms.registry import AGGREGATORS, TABLES, get_preset, split_plugins

    piece_fields = {f.name for table in TABLES.values() for cls in table.values()
                    for f in dataclasses.fields(cls.config_class)}
    decentralized = bool(AGGREGATORS[split_plugins(args.aggregator_name)[0]].capabilities.decentralized)
    values = {field_name: getattr(args, field_name) for field_name in convention_fields()
              if _reads(args, field_name, piece_fields, decentralized)}
    return MemberConventions(name=name, values=values, defaulted=frozenset(getattr(args, "_defaulted_fields", ())),
                             method_fields=frozenset(get_preset(args.fed_algorithm).method_fields))


@dataclass(frozen=True)
class Alignment:
    """One convention changed for one member: from its preset's value to the reference's."""

    field: str
    member: str
    preset_value: Any
    aligned_value: Any
    reference: str


@dataclass
class ConventionReport:
    """What a comparison aligned (``aligned``), and where its members still differ in more than their methods
    (``differing``: member -> {field: its value}, against ``reference_values``): those members are flagged."""

    mode: str
    members: list[str]
    aligned: list[Alignment] = field(default_factory=list)
    differing: dict[str, dict[str, Any]] = field(default_factory=dict)
    reference_values: dict[str, tuple[str, Any]] = field(default_factory=dict)
    opt_out: str = "conventions: per_method"

    @property
    def mixed(self) -> bool:
        """True when some member differs from the reference in a convention (the table is not like for like)."""
        return bool(self.differing)

    def changes_for(self, member: str) -> dict[str, Any]:
        """``{field: aligned value}`` of the member's aligned conventions."""
        return {a.field: a.aligned_value for a in self.aligned if a.member == member}

    def flag(self, member: str) -> str:
        """The table's note for ``member``: ``""``, or ``"† aggregation_weights=uniform"`` (what differs)."""
        fields = self.differing.get(member)
        if not fields:
            return ""
        return f"{FLAG} " + ", ".join(f"{k}={v}" for k, v in fields.items())

    def lines(self) -> list[str]:
        """The summary a run prints and writes above its table."""
        what = convention_fields()
        out = []
        if self.mode == "aligned":
            by_field: dict[str, list[Alignment]] = {}
            for a in self.aligned:
                by_field.setdefault(a.field, []).append(a)
            if by_field:
                out.append("Conventions aligned, so that the members differ only in their methods:")
                for name, changes in by_field.items():
                    moved = ", ".join(f"{a.member} {a.preset_value} -> {a.aligned_value}" for a in changes[:SHOWN])
                    moved += f", ... ({len(changes)} members in all)" if len(changes) > SHOWN else ""
                    out.append(f"  {name} = {changes[0].aligned_value} ({changes[0].reference}'s) for every member "
                               f"that reads it [{what.get(name, '')}]: {moved}")
            else:
                out.append("Conventions: the members already share them; nothing aligned.")
            out.append(f"Each member with its own paper's conventions instead: {self.opt_out}.")
        else:
            out.append("Conventions per method: each member runs with its own paper's conventions.")
        return out + self.difference_lines()

    def difference_lines(self) -> list[str]:
        """The members that differ from the reference in more than their method, one line each ([] when none)."""
        out = []
        if self.differing:
            out.append(f"Not like for like: the rows marked {FLAG} differ from the reference in more than their method:")
            for member, fields in list(self.differing.items())[:SHOWN]:
                details = ", ".join(f"{k}={v} (reference {self.reference_values[k][0]}: {self.reference_values[k][1]})"
                                    for k, v in fields.items())
                out.append(f"  {member}: {details}")
            if len(self.differing) > SHOWN:
                out.append(f"  ... ({len(self.differing)} members in all)")
        return out

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "members": list(self.members), "like_for_like": not self.mixed,
                "aligned": [dataclasses.asdict(a) for a in self.aligned],
                "differing": {m: dict(f) for m, f in self.differing.items()},
                "reference_values": {k: {"member": m, "value": v} for k, (m, v) in self.reference_values.items()},
                "opt_out": self.opt_out}


def recorded_conventions(name: str, folder) -> MemberConventions | None:
    """The conventions a finished run recorded in ``final_model/federated_config.json`` (its ``training`` settings,
    its pieces' hyperparameters, its clients per round); None for a run that recorded none. Nothing can be aligned
    after the fact: every value counts as given."""
    import json
    from pathlib import Path

    from ..algorithms.registry import get_preset

    path = Path(folder) / "final_model" / "federated_config.json"
    try:
        recorded = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(recorded, dict) or not isinstance(recorded.get("training"), dict):
        return None
    sources = [recorded["training"], recorded.get("algorithm_hyperparameters") or {},
               {"clients_per_round": recorded.get("clients_per_round")}]
    values = {}
    for field_name in convention_fields():
        for source in sources:
            if field_name in source:
                values[field_name] = source[field_name]
                break
    algorithm = str((recorded.get("algorithm") or {}).get("name", "")).split(" ")[0]
    try:
        method_fields = frozenset(get_preset(algorithm).method_fields)
    except ValueError:
        method_fields = frozenset()
    return MemberConventions(name=name, values=values, method_fields=method_fields)


def plan_alignment(members: Sequence[MemberConventions], mode: str = "aligned", reference: str | None = None,
                   opt_out: str = "conventions: per_method") -> ConventionReport:
    """Which member takes which value of each convention (see the module docstring); ``reference``: the member whose
    values win (default: the first that reads the field)."""
    check_convention_mode("conventions", mode)
    order = sorted(members, key=lambda m: m.name != reference) if reference is not None else list(members)
    report = ConventionReport(mode=mode, members=[m.name for m in members], opt_out=opt_out)
    for name in convention_fields():
        readers = [m for m in order if name in m.values and name not in m.method_fields]
        if len(readers) < 2:
            continue
        source = readers[0]
        value = source.values[name]
        for member in sorted(readers, key=lambda m: report.members.index(m.name)):
            current = member.values[name]
            if current == value:
                continue
            # an unset reference (None) cannot be given to a member: None means "the preset's default" again
            if mode == "aligned" and name in member.defaulted and value is not None:
                report.aligned.append(Alignment(name, member.name, current, value, source.name))
            else:
                report.differing.setdefault(member.name, {})[name] = current
                report.reference_values[name] = (source.name, value)
    return report
