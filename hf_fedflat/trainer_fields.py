"""The ``TrainingArguments`` fields a federated run inherits: how each one it uses is checked, which it refuses.

:class:`~hf_fedflat.FedTrainingArguments` calls :func:`check_trainer_fields` first thing in ``__post_init__``,
so a bad value fails before any data or model loads, with a ``ValueError`` that starts with the field's name:

* :func:`coerce_field_types`: a string given for a number or bool field (a YAML 1.1 ``1e-4``, a Python caller's
  ``"0.1"``) becomes that type, or the field is named as not convertible;
* :data:`REFUSED_TRAINER_FIELDS`: Trainer fields the federated loop does not use (its own rounds, evaluation,
  checkpoints and logging replace them) are refused when set to anything but their default, naming the federated
  field to use instead;
* :data:`INHERITED_CHECKS`: every other inherited field the run uses (each client's local ``Trainer``: batch sizes,
  optimizer, schedule, clipping, data loading; the run: seed, ``output_dir``, ``report_to``) is range-checked.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import types
import typing
from collections.abc import Callable
from typing import Any

from .field_checks import check_choice, check_integer, check_number, fail

__all__ = ["INHERITED_CHECKS", "REFUSED_TRAINER_FIELDS", "RefusedField", "check_output_dir", "check_trainer_fields",
           "coerce_field_types"]

#: ``seed`` goes to NumPy / scikit-learn, which take 0 .. 2**32 - 1
SEED_MAX = 2**32 - 1


# -------------------------------------------------------------------------------------------------
# strings -> the field's type
# -------------------------------------------------------------------------------------------------
_TRUE, _FALSE = ("true", "yes", "y", "t", "on", "1"), ("false", "no", "n", "f", "off", "0")


@functools.cache
def _scalar_field_types(cls: type) -> dict[str, type]:
    """``{field: int | float | bool}`` for the fields of ``cls`` whose type is one of them (or ``Optional`` of one)."""
    hints = typing.get_type_hints(cls)
    scalars = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        kind = hints.get(f.name)
        if typing.get_origin(kind) in (typing.Union, types.UnionType):
            options = [a for a in typing.get_args(kind) if a is not type(None)]
            kind = options[0] if len(options) == 1 else None
        if kind in (int, float, bool):
            scalars[f.name] = kind
    return scalars


def _convert(name: str, value: str, kind: type) -> Any:
    text = value.strip()
    if kind is bool:
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        fail(name, f"must be true or false, got {value!r}.")
    try:
        number = float(text)
    except ValueError:
        fail(name, f"must be {'an integer' if kind is int else 'a number'}, got {value!r}.")
    if kind is float:
        return number
    try:
        return int(text)
    except ValueError:
        if number.is_integer():  # "1e3" (YAML 1.1 reads it as a string)
            return int(number)
        fail(name, f"must be an integer, got {value!r}.")


def coerce_field_types(args: Any) -> None:
    """Convert, in place, string values of int / float / bool fields of the dataclass ``args`` to that type (what
    ``HfArgumentParser`` does to flags); a string that is not one raises ``ValueError("<field>: ...")``."""
    for name, kind in _scalar_field_types(type(args)).items():
        value = getattr(args, name)
        if isinstance(value, str):
            setattr(args, name, _convert(name, value, kind))


# -------------------------------------------------------------------------------------------------
# Trainer fields the federated loop does not use
# -------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class RefusedField:
    """A ``TrainingArguments`` field the federated loop does not use; ``use_instead`` says what does its job."""

    name: str
    use_instead: str
    #: values besides the field's default that mean the same as not setting it
    also_accepted: tuple = ()


_EVAL = "the federated loop evaluates the global model every eval_every_n_rounds rounds (and after the last)"
_SAVE = ("the federated loop checkpoints the whole run (global model, server and client states) every "
         "save_every_n_rounds rounds under <output_dir>/checkpoints (save_total_limit keeps the newest)")
_LOG = ("the federated loop logs one record per round (history.json and report_to); evaluation metrics every "
        "eval_every_n_rounds rounds")
_BEST = ("final_model/ is the last round's global model; keep checkpoints with save_every_n_rounds and resume or "
         "load the one you want (history.json has every round's metrics)")

#: Trainer fields refused unless left at their default (or a value in ``also_accepted``), with the federated field
#: that replaces each (the README's "Trainer flags a federated run refuses" table).
REFUSED_TRAINER_FIELDS: tuple[RefusedField, ...] = (
    RefusedField("num_train_epochs", "set local_epochs (local epochs per client per round) and num_rounds"),
    RefusedField("max_steps", "set local_steps (steps per client per round) and num_rounds", (0,)),
    RefusedField("eval_strategy", f"set eval_every_n_rounds: {_EVAL}", ("no",)),
    RefusedField("eval_steps", f"set eval_every_n_rounds: {_EVAL}"),
    RefusedField("eval_delay", f"set eval_every_n_rounds: {_EVAL}"),
    RefusedField("eval_on_start", f"set eval_every_n_rounds: {_EVAL}"),
    RefusedField("save_strategy", f"set save_every_n_rounds: {_SAVE}", ("no",)),
    RefusedField("save_steps", f"set save_every_n_rounds: {_SAVE}"),
    RefusedField("save_only_model", f"set save_every_n_rounds: {_SAVE}; final_model/ holds the model alone"),
    RefusedField("save_on_each_node", f"set save_every_n_rounds: {_SAVE}, written by the main process"),
    RefusedField("enable_jit_checkpoint", f"set save_every_n_rounds: {_SAVE}; resume with resume_from_checkpoint"),
    RefusedField("ignore_data_skip", "resume_from_checkpoint restarts at the round after the checkpoint; there is "
                 "no epoch to skip into"),
    RefusedField("restore_callback_states_from_checkpoint",
                 "resume_from_checkpoint restores the federated run's state (rounds, server and client states)"),
    RefusedField("logging_strategy", f"nothing to set: {_LOG}", ("no",)),
    RefusedField("logging_steps", f"nothing to set: {_LOG}"),
    RefusedField("logging_first_step", f"nothing to set: {_LOG}"),
    RefusedField("load_best_model_at_end", _BEST),
    RefusedField("metric_for_best_model", f"{_BEST}; target_accuracy reports the first round reaching an accuracy"),
    RefusedField("greater_is_better", _BEST),
    RefusedField("data_seed", "set seed: each client's data order comes from (seed, round, client), and the "
                 "partition from partition_seed (default: seed)"),
)


def _trainer_defaults() -> dict[str, Any]:
    from transformers import TrainingArguments

    return {f.name: f.default for f in dataclasses.fields(TrainingArguments) if f.default is not dataclasses.MISSING}


def check_refused_fields(args: Any) -> None:
    """Refuse a :data:`REFUSED_TRAINER_FIELDS` field set to a value other than its default."""
    defaults = _trainer_defaults()
    for row in REFUSED_TRAINER_FIELDS:
        value = getattr(args, row.name)
        accepted = (defaults[row.name], *row.also_accepted)
        if not any(value is ok or value == ok for ok in accepted):
            fail(row.name, f"is not used by federated training (got {value!r}); {row.use_instead}.")


# -------------------------------------------------------------------------------------------------
# the inherited fields a run uses
# -------------------------------------------------------------------------------------------------
Check = Callable[[str, Any, Any], None]  # (field name, value, the whole args)


def _integer(low: int = 1, high: int | None = None, optional: bool = False) -> Check:
    def check(name, value, args):
        if not (optional and value is None):
            check_integer(name, value, low=low, high=high)
    return check


def _number(low: float | None = None, high: float | None = None, low_open: bool = False, high_open: bool = False,
            optional: bool = False) -> Check:
    def check(name, value, args):
        if not (optional and value is None):
            check_number(name, value, low=low, high=high, low_open=low_open, high_open=high_open)
    return check


def _boolean(optional: bool = False) -> Check:
    def check(name, value, args):
        if not (isinstance(value, bool) or (optional and value is None)):
            fail(name, f"must be true or false, got {value!r}.")
    return check


def _enum(values: Callable[[], list[str]]) -> Check:
    def check(name, value, args):
        check_choice(name, getattr(value, "value", value), values())
    return check


def _scheduler_types() -> list[str]:
    from transformers.trainer_utils import SchedulerType

    return [s.value for s in SchedulerType]


def _optimizer_names() -> list[str]:
    from transformers.training_args import OptimizerNames

    return [o.value for o in OptimizerNames]


def _hub_strategies() -> list[str]:
    from transformers.trainer_utils import HubStrategy

    return [s.value for s in HubStrategy]


def _optim_args(name, value, args):
    """``optim_args``: ``key=value`` pairs separated by commas (``momentum=0.9,nesterov=True``), parsed by the
    Trainer only when a client first builds its optimizer."""
    if value is None or value == "":
        return
    if not isinstance(value, str):
        fail(name, f"must be a string of key=value pairs such as 'momentum=0.9', got {value!r}.")
    for item in value.replace(" ", "").split(","):
        key, equals, setting = item.partition("=")
        if not (key and equals and setting):
            fail(name, f"must be key=value pairs separated by commas (e.g. 'momentum=0.9,nesterov=True'); "
                       f"{item!r} in {value!r} is not one.")


def _json_object(name, value, args):
    if value is None or isinstance(value, dict):
        return
    if isinstance(value, str):
        try:
            parsed = json.loads(value) if value.strip() else {}
        except json.JSONDecodeError as error:
            fail(name, f"is not valid JSON ({error}); write e.g. '{{\"num_cycles\": 2}}'.")
        if isinstance(parsed, dict):
            return
    fail(name, f"must be a mapping (a JSON object), got {value!r}.")


#: schedules transformers builds without a warm-up: a warmup_steps given with them would do nothing
_SCHEDULES_WITHOUT_WARMUP = ("constant", "reduce_lr_on_plateau")


def _warmup_steps(name, value, args):
    check_number(name, value, low=0.0)
    schedule = str(getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type))
    if value and schedule in _SCHEDULES_WITHOUT_WARMUP:
        fail(name, f"the {schedule} schedule (lr_scheduler_type) has no warm-up, so {value:g} would do nothing; pass "
                   f"--lr_scheduler_type constant_with_warmup (or linear, cosine), or leave warmup_steps at 0.")


def _prefetch_factor(name, value, args):
    if value is None:
        return
    check_integer(name, value, low=1)
    if args.dataloader_num_workers == 0:
        fail(name, "needs dataloader_num_workers > 0 (it sets how many batches each worker loads ahead).")


def _report_to(name, value, args):
    names = [value] if isinstance(value, str) else list(value or [])
    names = [n for n in names if n not in ("none", "all")]
    if not names:
        return
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

    unknown = [n for n in names if n not in INTEGRATION_TO_CALLBACK]
    if unknown:
        fail(name, f"{', '.join(map(repr, unknown))} is not a reporting integration; use 'none', 'all' or "
                   f"{', '.join(INTEGRATION_TO_CALLBACK)}.")
    # transformers would fail on a missing package only when the Trainer is built, after the data has loaded
    from transformers.integrations import integration_utils

    missing = [n for n in names if n in _INTEGRATION_AVAILABLE
               and not getattr(integration_utils, _INTEGRATION_AVAILABLE[n], lambda: True)()]
    if missing:
        fail(name, f"{', '.join(map(repr, missing))} is not installed here; install its package or leave it out "
                   "of report_to.")


#: report_to name -> transformers' check that the integration's package is installed
_INTEGRATION_AVAILABLE = {
    "azure_ml": "is_azureml_available", "clearml": "is_clearml_available", "codecarbon": "is_codecarbon_available",
    "comet_ml": "is_comet_available", "dagshub": "is_dagshub_available", "dvclive": "is_dvclive_available",
    "flyte": "is_flytekit_available", "kubeflow": "is_kubeflow_available", "mlflow": "is_mlflow_available",
    "neptune": "is_neptune_available", "swanlab": "is_swanlab_available", "tensorboard": "is_tensorboard_available",
    "trackio": "is_trackio_available", "wandb": "is_wandb_available",
}


def _mixed_precision(name, value, args):
    _boolean()(name, value, args)
    if value and args.fp16:
        fail(name, "and fp16 are both set; pick one mixed precision.")


def check_output_dir(name: str, value: Any, args: Any = None) -> None:
    """``output_dir`` must be a folder this process can write, or a path whose nearest existing parent is one (it
    is created when the run starts): checked up front, so a file or a read-only place fails with the field's name."""
    if value is None:
        return  # TrainingArguments picks 'trainer_output' (checked on the next construction)
    if not isinstance(value, (str, os.PathLike)) or not str(value):
        fail(name, f"must be a folder path, got {value!r}.")
    path = os.path.abspath(os.path.expanduser(os.fspath(value)))
    if os.path.lexists(path) and not os.path.isdir(path):
        fail(name, f"{value} exists and is not a folder; pass a folder (it is created if missing).")
    existing = path
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        fail(name, f"cannot create {value}: {existing} is a file, not a folder.")
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "it" if existing == path else f"its parent {existing}"
        fail(name, f"cannot write to {value}: {where} is read-only for this user; pass a writable folder.")


#: Every inherited Trainer field a federated run reads, with its check (run in this order, after the refused
#: fields); the federated fields and the pieces' hyperparameters are checked by their own dataclasses.
INHERITED_CHECKS: tuple[tuple[str, Check], ...] = (
    ("output_dir", check_output_dir),
    ("seed", _integer(low=0, high=SEED_MAX)),
    ("learning_rate", _number(low=0.0, low_open=True)),
    ("per_device_train_batch_size", _integer(low=1)),
    ("per_device_eval_batch_size", _integer(low=1)),
    ("gradient_accumulation_steps", _integer(low=1)),
    ("eval_accumulation_steps", _integer(low=1, optional=True)),
    ("weight_decay", _number(low=0.0)),
    ("max_grad_norm", _number(low=0.0, optional=True)),
    ("label_smoothing_factor", _number(low=0.0, high=1.0, high_open=True)),
    ("optim", _enum(_optimizer_names)),
    ("optim_args", _optim_args),
    ("adam_beta1", _number(low=0.0, high=1.0, high_open=True)),
    ("adam_beta2", _number(low=0.0, high=1.0, high_open=True)),
    ("adam_epsilon", _number(low=0.0)),
    ("lr_scheduler_type", _enum(_scheduler_types)),
    ("lr_scheduler_kwargs", _json_object),
    ("warmup_steps", _warmup_steps),
    ("dataloader_num_workers", _integer(low=0)),
    ("dataloader_prefetch_factor", _prefetch_factor),
    ("dataloader_drop_last", _boolean()),
    ("dataloader_pin_memory", _boolean()),
    ("dataloader_persistent_workers", _boolean()),
    ("train_sampling_strategy", _enum(lambda: ["random", "sequential", "group_by_length", "batch_rebalance"])),
    ("torch_empty_cache_steps", _integer(low=1, optional=True)),
    ("fp16", _boolean()),
    ("bf16", _mixed_precision),
    ("use_cpu", _boolean()),
    ("disable_tqdm", _boolean(optional=True)),
    ("save_total_limit", _integer(low=1, optional=True)),
    ("report_to", _report_to),
    ("push_to_hub", _boolean(optional=True)),
    ("do_eval", _boolean()),  # the final evaluation and test predictions (hf_fedflat.cli.final_evaluation)
    ("do_predict", _boolean()),
    ("hub_strategy", _enum(_hub_strategies)),
)


def check_trainer_fields(args: Any) -> None:
    """Convert string values, refuse the unused Trainer fields, check every inherited field a run uses."""
    coerce_field_types(args)
    check_refused_fields(args)
    for name, check in INHERITED_CHECKS:
        check(name, getattr(args, name), args)
