"""One way every entry point reads its configuration: flags, a YAML/JSON file, a recipe's defaults and ``--smoke``.

``hf-fedflat train``, every script in ``recipes/`` and Python callers parse through :func:`parse_arguments`
(``HfArgumentParser`` underneath). What wins, from strongest to weakest:

1. the flags given (``--num_rounds 50``);
2. ``--config run.yaml`` (or ``run.yaml`` as the first argument): any field of the parsed dataclasses; a value
   written as a string (YAML 1.1 reads ``1e-4`` as one) is converted to the field's type like a flag, a number
   given to a text field becomes its text (``fed_algorithm: 5`` is ``"5"``, as ``--fed_algorithm 5``), and
   one that is not of that type raises ``ValueError("<field>: ...")``; an unknown key is refused;
3. with ``--smoke``, the recipe's smoke list (tiny data, model and rounds);
4. the recipe's own defaults (its paper's set-up);
5. the dataclasses' defaults.

``--help`` lists the recipe's and the federated fields first and the inherited ``TrainingArguments`` fields last,
with the recipe's defaults and docstring. ``FedTrainingArguments`` built directly in Python converts string values
the same way in ``__post_init__`` (:func:`hf_fedflat.trainer_fields.coerce_field_types`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ..field_checks import ConfigError  # (declared beside the field checks, which raise it)

__all__ = ["CONFIG_SUFFIXES", "ConfigError", "TRAIN_DESCRIPTION", "build_parser", "explicit_fields", "parse_arguments",
           "parse_train_args", "parse_train_arguments", "read_config_file", "split_config", "train_argument_types",
           "wants_smoke", "warn_about_token_flag"]

logger = logging.getLogger(__name__)

CONFIG_SUFFIXES = (".yaml", ".yml", ".json")

#: help groups, in the order ``--help`` shows them, for the argument dataclasses it knows by name
_GROUP_TITLES = {
    "DataArguments": "data options",
    "ModelArguments": "model options",
    "LoraArguments": "LoRA options",
}
RECIPE_GROUP = "recipe options"
FEDERATED_GROUP = "federated options (the run, its algorithm and each client's local training)"
HYPERPARAMETER_GROUP = "algorithm hyperparameters (each piece's; unset: the preset's default, then the piece's)"
INHERITED_GROUP = "inherited Trainer options (transformers.TrainingArguments, for each client's local Trainer)"


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The description (a recipe's docstring) as written, and every flag's default."""


def read_config_file(path: str | os.PathLike) -> dict[str, Any]:
    """The ``field: value`` mapping of a YAML or JSON file; a file that is missing, a folder, unreadable or not
    valid YAML/JSON raises :class:`ConfigError` naming it (one line, with the line and column of a syntax error)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise ConfigError(f"config: {path} is a folder; give a YAML or JSON file of field: value.")
    if not os.path.isfile(path):
        raise ConfigError(f"config: {path} does not exist.")
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"config: cannot read {path} ({error}).") from None
    if path.endswith(".json"):
        def unique_keys(pairs):
            seen = [key for key, _ in pairs]
            twice = next((key for i, key in enumerate(seen) if key in seen[:i]), None)
            if twice is not None:
                raise ConfigError(f"config: {path} sets {twice!r} twice in one object; keep one.")
            return dict(pairs)

        if not text.strip():
            raise ConfigError(f"config: {path} is empty; give its fields (field: value), or leave --config out.")
        try:
            values = json.loads(text, object_pairs_hook=unique_keys)
        except json.JSONDecodeError as error:
            raise ConfigError(f"config: {path} is not valid JSON (line {error.lineno}, column {error.colno}: "
                              f"{error.msg}).") from None
    else:
        import yaml

        class UniqueKeyLoader(yaml.SafeLoader):  # a key given twice is refused, not the last one taken silently
            def construct_mapping(self, node, deep=False):
                first: dict = {}
                for key_node, _ in node.value:
                    key = self.construct_object(key_node, deep=True)
                    line = key_node.start_mark.line + 1
                    if key in first:
                        raise ConfigError(f"config: {path} sets {key!r} twice (lines {first[key]} and {line}); "
                                          "keep one.")
                    first[key] = line
                return super().construct_mapping(node, deep)

        try:
            values = yaml.load(text, Loader=UniqueKeyLoader)
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
            problem = getattr(error, "problem", None) or " ".join(str(error).split())
            raise ConfigError(f"config: {path} is not valid YAML ({where}{problem}).") from None
        if values is None:  # nothing but comments or blank lines: not the defaults run by mistake
            raise ConfigError(f"config: {path} is empty; give its fields (field: value), or leave --config out.")
    if not isinstance(values, dict):
        raise ConfigError(f"config: {path} must hold a mapping of field: value, got {type(values).__name__}.")
    return values


def _group_of(dtype: type) -> tuple[str, set[str] | None]:
    """``(title, the fields of dtype that go there)``; ``None`` = every field."""
    from transformers import TrainingArguments

    if isinstance(dtype, type) and issubclass(dtype, TrainingArguments) and dtype is not TrainingArguments:
        own: set[str] = set()
        for cls in dtype.__mro__:
            if cls is TrainingArguments:
                break
            own |= set(vars(cls).get("__annotations__", {}))
        return FEDERATED_GROUP, own
    return _GROUP_TITLES.get(dtype.__name__, RECIPE_GROUP), None


def _arrange_help(parser: argparse.ArgumentParser, dataclass_types: Sequence[type]) -> None:
    """Move the flags into titled groups: recipe, federated, data, model, LoRA, then the inherited Trainer fields
    (marked when a federated run refuses them)."""
    from transformers import TrainingArguments

    from ..trainer_fields import REFUSED_TRAINER_FIELDS

    from ..algorithms.registry import hyperparameter_fields

    refused = {row.name: row for row in REFUSED_TRAINER_FIELDS}
    hyperparameters = {f.name for f in hyperparameter_fields()}
    title_of: dict[str, str] = {}
    for dtype in dataclass_types:
        title, own = _group_of(dtype)
        for f in dataclasses.fields(dtype):
            if own is None or f.name in own:
                title_of[f.name] = HYPERPARAMETER_GROUP if title == FEDERATED_GROUP and f.name in hyperparameters \
                    else title
            elif issubclass(dtype, TrainingArguments):
                title_of[f.name] = INHERITED_GROUP
    order = [RECIPE_GROUP, FEDERATED_GROUP, HYPERPARAMETER_GROUP, *_GROUP_TITLES.values(), INHERITED_GROUP]
    titles = sorted(set(title_of.values()), key=order.index)
    groups = {title: parser.add_argument_group(title) for title in titles}
    for action in list(parser._optionals._group_actions):
        title = title_of.get(action.dest)
        if title is None:
            continue  # --help, --config
        parser._optionals._group_actions.remove(action)
        groups[title]._group_actions.append(action)
        _shorten(action)
        if action.dest in refused and action.help is not None:
            action.help = f"Refused by federated runs unless left at its default: {refused[action.dest].use_instead}."
        elif title == INHERITED_GROUP and action.help:
            action.help = _first_sentence(action.help)  # transformers' docs hold the rest
    # the federated fields in their declaration order (the Trainer fields whose defaults it changes come after)
    declared = {name: i for i, name in enumerate(n for t in dataclass_types for n in _declared_fields(t))}
    if FEDERATED_GROUP in groups:
        groups[FEDERATED_GROUP]._group_actions.sort(key=lambda a: declared.get(a.dest, len(declared)))


def _first_sentence(text: str) -> str:
    match = re.match(r"(.+?[.!?])(\s|$)", " ".join(text.split()))
    return match.group(1) if match else text


def _declared_fields(dtype: type) -> list[str]:
    names: list[str] = []
    for cls in reversed(dtype.__mro__):
        if dataclasses.is_dataclass(cls) and cls.__module__.startswith("hf_fedflat"):
            names += [n for n in vars(cls).get("__annotations__", {}) if n not in names]
    return names


def _shorten(action: argparse.Action) -> None:
    """Help lines: one spelling of the flag (``--num_rounds``; ``--num-rounds`` still parses) and its value's type
    (``INT``, ``FLOAT``, ``BOOL``, ...) instead of the upper-cased field name."""
    if len(action.option_strings) > 1:
        action.option_strings = [s for s in action.option_strings if "-" not in s[2:]] or action.option_strings
    if action.nargs == 0:
        return
    kind = action.type
    name = {int: "INT", float: "FLOAT", str: "STR"}.get(kind)
    if name is None and getattr(kind, "__name__", "") == "string_to_bool":
        name = "BOOL"
    if action.choices is not None:
        return  # argparse shows {a,b,c}
    action.metavar = name or "VALUE"


#: ``--help``'s first groups: what a user sets first, described; every other field is listed by name after the
#: chosen algorithm's hyperparameters (``--help-all`` describes every field)
USER_GROUPS = {
    "model and data": ("model_name", "model_name_or_path", "task", "use_lora", "dataset_name", "data_dir",
                       "partition_scheme", "dirichlet_alpha"),
    "rounds and clients": ("fed_algorithm", "num_rounds", "num_clients", "clients_per_round", "local_epochs",
                           "local_steps"),
    "local training (each client's Trainer)": ("learning_rate", "optim", "per_device_train_batch_size",
                                               "weight_decay", "seed", "output_dir", "report_to", "use_cpu"),
}
OTHER_FIELDS_GROUP = "every other field, by name (--help-all describes each)"


class _HelpAction(argparse.Action):
    """``-h/--help``: the user's fields, the chosen algorithm's hyperparameters, the rest by name;
    ``--help-all``: every field described."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None, full=False):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)
        self.full = full

    def __call__(self, parser, namespace, values, option_string=None):
        if not self.full:
            _arrange_short_help(parser, _help_algorithm(parser, namespace))
        parser.print_help()
        parser.exit()


def _help_algorithm(parser: argparse.ArgumentParser, namespace: argparse.Namespace) -> dict[str, str | None]:
    """``fed_algorithm`` and the parts given, as the run would read them: a flag anywhere on the command line (also
    after ``--help``), else the config file's or the recipe's value, else the default."""
    tokens = list(getattr(parser, "help_tokens", ()))
    chosen = {}
    for name in ("fed_algorithm", "perturbation", "corrections", "aggregator"):
        value = getattr(namespace, name, None)
        for i, token in enumerate(tokens):
            if token == f"--{name}" and i + 1 < len(tokens):
                value = tokens[i + 1]
            elif token.startswith(f"--{name}="):
                value = token.split("=", 1)[1]
        chosen[name] = value
    return chosen


def _algorithm_defaults(chosen: dict[str, str | None]) -> dict[str, Any] | None:
    """``{hyperparameter: its default in this algorithm}`` for the pieces ``chosen`` names (the preset's default,
    else the piece's), in piece order; None when a name is unknown."""
    from ..algorithms.composed import resolve_parts
    from ..algorithms.registry import (AGGREGATOR_PLUGINS, AGGREGATORS, CORRECTIONS, PERTURBATIONS, get_preset,
                                       split_plugins)

    try:
        perturbation, corrections, aggregator = resolve_parts(chosen["fed_algorithm"], chosen["perturbation"],
                                                              chosen["corrections"], chosen["aggregator"])
        preset = dict(get_preset(chosen["fed_algorithm"]).defaults)
    except (KeyError, ValueError):
        return None
    base, plugins = split_plugins(aggregator)
    pieces = [PERTURBATIONS[perturbation], *(CORRECTIONS[c] for c in corrections), AGGREGATORS[base],
              *(AGGREGATOR_PLUGINS[p] for p in plugins)]
    defaults: dict[str, Any] = {}
    for piece in pieces:
        for name, value in piece.config_class.defaults().items():
            defaults.setdefault(name, preset.get(name, value))
    return defaults


def _arrange_short_help(parser: argparse.ArgumentParser, chosen: dict[str, str | None]) -> None:
    """Regroup ``parser``'s flags for ``--help`` (it exits next): :data:`USER_GROUPS` described, then the chosen
    algorithm's hyperparameters described (with its defaults), then every other field by name, per group."""
    import textwrap

    recipe = [g for g in parser._action_groups if g.title and g.title.startswith("this recipe's settings")]
    kept = {id(a) for g in recipe for a in g._group_actions}
    actions = {a.dest: a for g in parser._action_groups if g not in recipe for a in g._group_actions
               if id(a) not in kept and a.option_strings and not isinstance(a, _HelpAction) and a.dest != "config"}
    algorithm = _algorithm_defaults(chosen)
    label = chosen["fed_algorithm"] + "".join(f", {k} {v}" for k, v in chosen.items() if k != "fed_algorithm" and v)
    sections: list[tuple[str, list[argparse.Action], str | None]] = []
    for title, names in USER_GROUPS.items():
        sections.append((title, [actions.pop(n) for n in names if n in actions], None))
    if algorithm is None:
        sections.append((f"hyperparameters of {label}", [], "unknown algorithm: `hf-fedflat list` names them."))
    else:
        own = [actions.pop(n) for n in algorithm if n in actions]
        for action in own:  # unset: shown at this algorithm's default (help exits next); a config's value stays
            if action.default is None:
                action.default = algorithm[action.dest]
        sections.append((f"hyperparameters of {label} (`--fed_algorithm <name> --help` shows another's)", own,
                         None if own else "none: it has no hyperparameters."))
    # every other field: one wrapped line of flag names per original group
    lines = []
    for group in parser._action_groups:
        if group in recipe or group.title in ("options", "positional arguments"):
            continue
        names = [f"--{a.dest}" for a in group._group_actions if actions.get(a.dest) is a]
        if names:
            short = group.title.split(" (")[0]
            lines += textwrap.wrap(f"{short}: {' '.join(names)}", width=100, subsequent_indent="    ")
    for action in actions.values():
        action.help = argparse.SUPPRESS
    for group in list(parser._action_groups):
        if group not in recipe and group.title not in ("options", "positional arguments"):
            parser._action_groups.remove(group)
    for title, group_actions, description in sections:
        group = parser.add_argument_group(title, description)
        group._group_actions.extend(group_actions)
    parser.add_argument_group(OTHER_FIELDS_GROUP, "\n".join(lines))


def build_parser(dataclass_types: Sequence[type], *, prog: str | None = None, description: str | None = None):
    """``HfArgumentParser`` of ``dataclass_types`` with ``--config``, a short usage line and grouped ``--help``
    (``--help-all``: every field described)."""
    from transformers import HfArgumentParser

    prog = prog or "hf-fedflat"
    parser = HfArgumentParser(list(dataclass_types), prog=prog, description=description,
                              formatter_class=_HelpFormatter, allow_abbrev=False, add_help=False,
                              usage=f"{prog} [--config run.yaml] [--smoke] [--<field> <value> ...]")
    parser.add_argument("-h", "--help", action=_HelpAction,
                        help="The fields to set first and the chosen algorithm's hyperparameters, then every other "
                             "field by name.")
    parser.add_argument("--help-all", action=_HelpAction, full=True, help="Every field, described.")
    parser.add_argument("--config", default=None,
                        help="YAML or JSON file of any of these fields; flags given too win over it.")
    _arrange_help(parser, dataclass_types)
    return parser


def _recipe_group(parser: argparse.ArgumentParser, recipe_defaults: dict[str, Any], smoke: Sequence[str]) -> None:
    """Put the flags a recipe sets first in ``--help``, under a group that also says what ``--smoke`` sets."""
    description = f"--smoke sets: {' '.join(smoke)}" if smoke else None
    group = parser.add_argument_group("this recipe's settings (its defaults; any flag or --config wins)", description)
    parser._action_groups.remove(group)
    parser._action_groups.insert(parser._action_groups.index(parser._optionals) + 1, group)
    for other in parser._action_groups:
        if other is group:
            continue
        for action in list(other._group_actions):
            if action.dest in recipe_defaults:
                other._group_actions.remove(action)
                group._group_actions.append(action)


def _actions_by_flag(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return dict(parser._option_string_actions)


def _flag_values(parser: argparse.ArgumentParser, tokens: Sequence[str], where: str) -> dict[str, Any]:
    """``{dest: value}`` of a list of flags (a recipe's defaults): ``--name value``, ``--name=value``, or a bare
    boolean ``--name`` (true)."""
    actions = _actions_by_flag(parser)
    values: dict[str, Any] = {}
    tokens = list(tokens)
    i = 0
    while i < len(tokens):
        flag, equals, value = tokens[i].partition("=")
        action = actions.get(flag) if flag.startswith("--") else None
        if action is None:
            raise ValueError(f"{where}: {tokens[i]!r} is not a flag of this parser.")
        following = []
        while i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            following.append(tokens[i + 1])
            i += 1
        if equals:
            following = [value, *following]
        if action.nargs in ("+", "*"):
            values[action.dest] = following
        elif len(following) == 1:
            values[action.dest] = following[0]
        elif not following and action.const is not None:
            values[action.dest] = action.const
        else:
            raise ValueError(f"{where}: {flag} needs one value, got {following!r}.")
        i += 1
    return values


def _config_values(parser: argparse.ArgumentParser, values: dict[str, Any], path: str) -> dict[str, Any]:
    """The file's values as the flags would give them: a string for a typed field goes through the flag's type."""
    by_dest: dict[str, argparse.Action] = {}
    for action in parser._actions:  # a bool field's own flag comes before its --no_<field>
        by_dest.setdefault(action.dest, action)
    unknown = sorted(set(values) - set(by_dest) - {"config"})
    if unknown:
        raise ValueError(f"config: unknown field(s) {', '.join(unknown)} in {path}; `--help` lists the fields.")
    converted = {}
    for name, value in values.items():
        action = by_dest.get(name)
        if action is None:
            continue
        kind = action.type
        if kind is str and isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)  # `fed_algorithm: 5`, `held_out_domain: 3`: the text a flag would give
        if isinstance(value, str) and kind not in (None, str):
            try:
                value = kind(value) if kind is not int else _to_int(value)
            except (TypeError, ValueError, argparse.ArgumentTypeError):
                type_name = getattr(kind, "__name__", str(kind))
                raise ValueError(f"{name}: {value!r} in {path} is not a valid {type_name} value.") from None
        elif kind is int and isinstance(value, float):  # 2.0 is 2; 2.5 is no integer
            if not value.is_integer():
                raise ValueError(f"{name}: {value!r} in {path} is not a valid int value.")
            value = int(value)
        if action.choices is not None and value is not None and not isinstance(value, (list, tuple)):
            if value not in action.choices:
                raise ValueError(f"{name}: {value!r} in {path} must be one of {tuple(action.choices)}.")
        converted[name] = value
    return converted


def _to_int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        number = float(text)  # "1e3": YAML 1.1 reads it as a string
        if not number.is_integer():
            raise
        return int(number)


def split_config(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    """``(the --config path or a .yaml/.json first argument, the other arguments)``: ``train x.yaml --num_rounds 2``
    reads the file and lets the flags win, as ``--config x.yaml --num_rounds 2`` does."""
    argv = list(argv)
    positional = None
    if argv and argv[0].endswith(CONFIG_SUFFIXES) and not argv[0].startswith("-"):
        positional, argv = argv[0], argv[1:]
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", default=None)
    known, rest = pre.parse_known_args(argv)
    if positional is not None and known.config is not None:
        raise ConfigError(f"config: given twice ({positional} and --config {known.config}); give one file.")
    return positional or known.config, rest


def wants_smoke(argv: Sequence[str], config: dict[str, Any] | None = None) -> bool:
    """Whether ``--smoke`` (or ``smoke: true`` in the config file) asks for the smoke set-up."""
    from transformers.hf_argparser import string_to_bool

    for arg in argv:
        if arg == "--smoke":
            return True
        if arg.startswith("--smoke="):
            return string_to_bool(arg.split("=", 1)[1])
    value = (config or {}).get("smoke", False)
    return string_to_bool(value) if isinstance(value, str) else bool(value)


def explicit_fields(argv: Sequence[str]) -> set[str]:
    """The fields the user set: flags in ``argv`` and keys of its ``--config`` file."""
    path, rest = split_config(argv)
    names = {a[2:].split("=", 1)[0].replace("-", "_") for a in rest if a.startswith("--")}
    return names | (set(read_config_file(path)) if path else set())


def parse_arguments(
    dataclass_types: Iterable[type],
    argv: Sequence[str],
    *,
    defaults: Sequence[str] = (),
    smoke: Sequence[str] = (),
    prog: str | None = None,
    description: str | None = None,
    warn_token: bool = True,
) -> tuple:
    """One instance per type of ``dataclass_types``, from ``argv`` over the config file over the recipe's
    ``smoke`` list (with ``--smoke``) over its ``defaults`` (both lists of flags); see the module docstring.
    When one of the types has a ``hub_token`` field, a token given as a flag or in the config file is warned about
    (:func:`warn_about_token_flag`; ``warn_token=False``: not, for runs started by another command, a sweep's).

    >>> data_args, model_args, lora_args, args = parse_arguments(
    ...     (DataArguments, ModelArguments, LoraArguments, FedTrainingArguments), ["--config", "run.yaml"])
    """
    dataclass_types = list(dataclass_types)
    try:
        parsed = _parse(dataclass_types, argv, defaults, smoke, prog, description)
    except ConfigError:
        raise
    except ValueError as error:  # every field check names its field: one error type for every entry point
        raise ConfigError(str(error)) from error
    given = explicit_fields(argv)
    for values in parsed:  # the hyperparameters the user gave: a recipe's defaults and --smoke list are not
        if callable(getattr(values, "restrict_explicit_fields", None)):
            values.restrict_explicit_fields(given)
    if warn_token and any("hub_token" in {f.name for f in dataclasses.fields(t)} for t in dataclass_types):
        config_path, rest = split_config(argv)
        warn_about_token_flag(rest, read_config_file(config_path) if config_path else {}, config_path)
    return parsed


def _parse(dataclass_types, argv, defaults, smoke, prog, description) -> tuple:
    parser = build_parser(dataclass_types, prog=prog, description=description)
    path, rest = split_config(argv)
    parser.help_tokens = list(rest)  # --help reads --fed_algorithm wherever it stands
    config = read_config_file(path) if path else {}
    recipe_defaults = _flag_values(parser, defaults, "recipe defaults")
    parser.set_defaults(**recipe_defaults)
    if recipe_defaults:
        _recipe_group(parser, recipe_defaults, smoke)
    if wants_smoke(rest, config):
        parser.set_defaults(**_flag_values(parser, smoke, "recipe smoke settings"))
    if config:
        parser.set_defaults(**_config_values(parser, config, path))
    parsed = parser.parse_args_into_dataclasses(rest, look_for_args_file=False)
    return tuple(parsed[:len(dataclass_types)])  # (the last one is a namespace holding --config)


def train_argument_types() -> tuple[type, ...]:
    """The dataclasses ``hf-fedflat train`` and the recipes parse: data, model, LoRA, federated training."""
    from ..config import FedTrainingArguments
    from ..data.arguments import DataArguments
    from ..models.arguments import ModelArguments
    from ..models.lora import LoraArguments

    return DataArguments, ModelArguments, LoraArguments, FedTrainingArguments


def parse_train_arguments(argv: Sequence[str], **kwargs) -> tuple:
    """``(data_args, model_args, lora_args, training_args)`` as ``hf-fedflat train`` parses them (without its
    hub-token warning): for code that runs members of a run, such as a sweep, without importing the CLI."""
    kwargs.setdefault("warn_token", False)
    return parse_arguments(train_argument_types(), argv, **kwargs)


TRAIN_DESCRIPTION = """Run one federated experiment: a dataset split over clients, a model, a federated algorithm.

    hf-fedflat train recipes/configs/quickstart_fedavg.yaml --num_rounds 50

Flags win over the config file. Below: the fields to set first, the chosen algorithm's hyperparameters
(`--fed_algorithm fedsam --help` shows FedSAM's), then every other field by name; --help-all describes them all,
the inherited Trainer fields (transformers.TrainingArguments, each client's local Trainer) last."""


def parse_train_args(argv: Sequence[str], *, defaults: Sequence[str] = (), smoke: Sequence[str] = (),
                     prog: str = "hf-fedflat train", description: str | None = TRAIN_DESCRIPTION):
    """``(data_args, model_args, lora_args, training_args)`` from flags, an optional ``--config`` file and a
    recipe's ``defaults`` / ``smoke`` flags, through :func:`parse_arguments` (which warns about a ``--hub_token``
    given). Settings that contradict the algorithm are refused here, before any data loads, and hyperparameters given
    that no piece of it reads are warned about (``FedTrainingArguments.check_algorithm_settings``)."""
    data_args, model_args, lora_args, training_args = parse_arguments(
        train_argument_types(), argv, defaults=defaults, smoke=smoke, prog=prog, description=description)
    training_args.check_algorithm_settings()
    return data_args, model_args, lora_args, training_args


def warn_about_token_flag(argv: Sequence[str], config_values: dict | None = None, config_path: str | None = None) -> bool:
    """Warn when ``--hub_token`` is given as a flag (or in a config file): a command line is visible to
    every user of the machine (``ps``) and is echoed by ``accelerate launch`` when the run fails. The
    ``HF_TOKEN`` environment variable or ``hf auth login`` keep it out of both. True when it warned."""
    where = None
    if any(a == "--hub_token" or a.startswith("--hub_token=") for a in argv):
        where = "as a command-line flag (visible in `ps`, and echoed by `accelerate launch` when the run fails)"
    elif (config_values or {}).get("hub_token"):
        where = f"in the config file {config_path}"
    if where is None:
        return False
    logger.warning("hub_token is given %s; prefer the HF_TOKEN environment variable or `hf auth login` "
                   "(huggingface_hub reads either), and leave hub_token unset.", where)
    return True
