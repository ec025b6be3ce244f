"""``hf-fedflat sweep --config sweep.yaml``: a grid of ordinary runs and the table a paper reports.

A sweep file (YAML or JSON) names the grid; every member is an ``hf-fedflat train`` run of its own folder
``<output_dir>/<member>/``, built from the same fields and validated the same way::

    output_dir: outputs/sweeps/fedgam
    metric: eval_accuracy          # or eval_loss / eval_perplexity (lower is better); default: eval_accuracy
    target: 0.9                    # rounds and seconds to reach it (optional)
    baseline: fedavg               # optional: an algorithm (its entry without a grid); each row gets final / best
                                   # minus the baseline's of the same seed and partition (paired), mean +/- std
    base:                          # any train field, fixed for every member
      dataset_name: digits
      num_clients: 20
      num_rounds: 30
    algorithms:                    # a preset name, or a mapping: fed_algorithm + fields (+ name, + its own grid)
      - fedavg
      - {fed_algorithm: fedgam, grid: {rho: [0.01, 0.02], gam_alpha: [0.1, 0.2]}}
    grid: {}                       # field: [values], for every algorithm (cartesian product)
    partitions:                    # each a mapping of partition fields (+ name); default: base's partition
      - {name: dir0.3, partition_scheme: dirichlet, dirichlet_alpha: 0.3}
    seeds: [0, 1, 2]               # the run seed: training only (client sampling, initial model, batches)
    smoke:                         # with --smoke: merged over the keys above (base merged field by field)
      base: {num_rounds: 2, num_clients: 4}
      seeds: [0, 1]
    conventions: aligned           # aligned (default): every convention left to the presets (aggregation_weights,
                                   # ...) takes the baseline's (else the first entry's) value in every member;
                                   # per_method: each preset's own paper's (differing rows are flagged)
    launcher: local                # local (one after another, here) | submitit (SLURM through submitit)
    submitit: {timeout_min: 600, slurm_partition: gpu, gpus_per_node: 1}

Seeds vary the training only: every member's ``partition_seed`` is the sweep's ``partition_seed`` (default
0) and its data ``split_seed`` the sweep's ``split_seed`` (default: ``DataArguments``' constant) unless the
base, a partition or an algorithm entry sets them. Every member's arguments are parsed before the first
member runs (:func:`hf_fedflat.cli.parsing.parse_train_arguments` on the member's config file, written to
``<output_dir>/sweep/members/<member>.json``): an unknown key or a bad value stops the sweep before any run.

The members differ only in their methods unless ``conventions: per_method``: every convention of
:data:`hf_fedflat.algorithms.presets.CONVENTION_FIELDS` a member took from its preset is set to the reference
member's value in its fields (:mod:`hf_fedflat.cli.conventions`), written with them; a value given for one entry
alone is kept and its row flagged. What was aligned heads the table and goes to ``sweep/conventions.json``.

A member whose ``run_status.json`` says ``completed`` and which has ``final_model/`` is skipped, so is one that
says ``failed`` (it ended without training: an outcome, reported and counted in the table); one with checkpoints
resumes from its latest. A member whose folder was run with other fields (the sweep file was edited since:
``<member>/sweep_member.json``) stops the sweep before any run. The table (:func:`summarize_members`, one row
per algorithm x hyperparameters x partition, mean and sample standard deviation over the seeds whose run ended)
goes to
``<output_dir>/sweep/results.md`` / ``results.csv``, the curves (mean and a mean +/- std band) to
``results.png``.
"""

from __future__ import annotations

import argparse
import csv
import io
import itertools
import json
import logging
import math
import os
import re
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .conventions import check_convention_mode
from .summary import RunSummary, summarize_run

__all__ = ["SweepConfig", "SweepMember", "expand_members", "load_sweep_config", "main", "member_status",
           "run_member", "run_sweep", "summarize_members", "sweep_main", "write_tables"]

logger = logging.getLogger(__name__)

SWEEP_KEYS = ("output_dir", "metric", "target", "baseline", "base", "algorithms", "grid", "partitions", "seeds", "smoke",
              "launcher", "submitit", "split_seed", "partition_seed", "description", "conventions")
LAUNCHERS = ("local", "submitit")
SWEEP_FOLDER = "sweep"


@dataclass
class SweepMember:
    """One run of the grid: its folder name, its group (the table row) and its train fields."""

    name: str
    group: str
    algorithm: str
    hyperparameters: dict[str, Any]
    partition: str
    seed: int
    fields: dict[str, Any]

    @property
    def output_dir(self) -> str:
        return self.fields["output_dir"]


@dataclass
class SweepConfig:
    output_dir: str
    members: list[SweepMember]
    metric: str = "eval_accuracy"
    target: float | None = None
    baseline: str | None = None
    launcher: str = "local"
    submitit: dict[str, Any] = field(default_factory=dict)
    path: str | None = None
    conventions: str = "aligned"
    #: what :func:`align_conventions` aligned and which groups still differ in more than their method
    convention_report: Any = None


# -------------------------------------------------------------------------------------------------
# config
# -------------------------------------------------------------------------------------------------
def _fail(path: str | None, message: str):
    raise ValueError(f"sweep config{f' {path}' if path else ''}: {message}")


def _mapping(value, what: str, path) -> dict:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        _fail(path, f"{what} must be a mapping of field: value, got {type(value).__name__}.")
    return dict(value)


def _grid(value, what: str, path) -> dict[str, list]:
    grid = _mapping(value, what, path)
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            _fail(path, f"{what}.{key} must be a non-empty list of values, got {values!r}.")
    return grid


def _changed_parts(fed_algorithm, fields: Mapping[str, Any]) -> list[str]:
    """The parts (perturbation, corrections, aggregator) ``fields`` give that differ from the preset's; [] for a name
    that is no preset (refused when the members are checked)."""
    from ..algorithms.conflicts import algorithm_label

    parts = [k for k in ("perturbation", "corrections", "aggregator") if fields.get(k) is not None]
    try:
        label = algorithm_label(fed_algorithm, *(fields.get(k) for k in ("perturbation", "corrections", "aggregator")))
    except ValueError:
        return []
    return [k for k in parts if f"{k}=" in label]


def _label(value) -> str:
    text = f"{value:g}" if isinstance(value, float) else str(value)
    return re.sub(r"[^A-Za-z0-9.\-]+", "-", text).strip("-")


def _merge_smoke(values: dict, path) -> dict:
    smoke = _mapping(values.get("smoke"), "smoke", path)
    unknown = sorted(set(smoke) - set(SWEEP_KEYS) - {"smoke"})
    if unknown:
        _fail(path, f"unknown key(s) {', '.join(unknown)} in smoke; it takes the sweep's own keys.")
    merged = dict(values)
    for key, value in smoke.items():
        if key == "base":
            merged["base"] = {**_mapping(values.get("base"), "base", path), **_mapping(value, "smoke.base", path)}
        else:
            merged[key] = value
    return merged


def expand_members(values: Mapping[str, Any], *, path: str | None = None, smoke: bool = False,
                   output_dir: str | None = None) -> SweepConfig:
    """The members of a sweep mapping (see the module docstring), not yet validated as train arguments."""
    values = dict(values)
    unknown = sorted(set(values) - set(SWEEP_KEYS))
    if unknown:
        _fail(path, f"unknown key(s) {', '.join(unknown)}; a sweep takes {', '.join(SWEEP_KEYS)} (train fields go "
                    "under base:, an algorithm entry, grid: or partitions:).")
    if smoke:
        values = _merge_smoke(values, path)
    output_dir = output_dir or values.get("output_dir")
    if not output_dir:
        _fail(path, "output_dir: missing (the folder of the member runs and the tables).")
    base = _mapping(values.get("base"), "base", path)
    for reserved in ("output_dir", "seed", "fed_algorithm", "config"):
        if reserved in base:
            _fail(path, f"base.{reserved}: set by the sweep (output_dir: the sweep's; seed: seeds:; fed_algorithm: "
                        "algorithms:).")
    launcher = values.get("launcher", "local")
    if launcher not in LAUNCHERS:
        _fail(path, f"launcher: must be one of {LAUNCHERS}, got {launcher!r}.")
    conventions = values.get("conventions", "aligned")
    try:
        check_convention_mode("conventions", conventions)
    except ValueError as error:
        _fail(path, str(error))
    metric = values.get("metric", "eval_accuracy")
    if not isinstance(metric, str) or not metric.startswith("eval_"):
        _fail(path, f"metric: a history.json key such as eval_accuracy, eval_loss or eval_perplexity, got {metric!r}.")
    target = values.get("target")
    if target is not None and (isinstance(target, bool) or not isinstance(target, (int, float))):
        _fail(path, f"target: a number (the {metric} to reach), got {target!r}.")
    baseline = values.get("baseline")
    if baseline is not None and not isinstance(baseline, str):
        _fail(path, f"baseline: an algorithm's name as the table shows it (e.g. fedavg), got {baseline!r}.")
    seeds = values.get("seeds", [42])
    if not isinstance(seeds, list) or not seeds or any(isinstance(s, bool) or not isinstance(s, int) for s in seeds):
        _fail(path, f"seeds: a non-empty list of integers, got {seeds!r}.")
    if len(set(seeds)) != len(seeds):
        _fail(path, f"seeds: repeated values in {seeds}.")
    algorithms = values.get("algorithms")
    if not isinstance(algorithms, list) or not algorithms:
        _fail(path, "algorithms: a non-empty list of presets (or mappings with fed_algorithm).")
    shared_grid = _grid(values.get("grid"), "grid", path)
    partitions = values.get("partitions") or [{}]
    # without partitions: the row shows the base's partition (e.g. dirichlet(0.3)), one partition for every member
    base_partition = str(base.get("partition_scheme", "base")) + (
        f"({_label(base['dirichlet_alpha'])})" if base.get("partition_scheme") == "dirichlet" and "dirichlet_alpha" in base
        else "")
    if not isinstance(partitions, list):
        _fail(path, f"partitions: a list of mappings of partition fields, got {partitions!r}.")
    fixed = {}
    for key in ("split_seed", "partition_seed"):
        value = values.get(key, 0 if key == "partition_seed" else None)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            _fail(path, f"{key}: an integer, got {value!r}.")
        if value is not None:
            fixed[key] = value

    members: list[SweepMember] = []
    for a_index, entry in enumerate(algorithms):
        if isinstance(entry, str):
            entry = {"fed_algorithm": entry}
        entry = _mapping(entry, f"algorithms[{a_index}]", path)
        if "fed_algorithm" not in entry:
            _fail(path, f"algorithms[{a_index}]: needs fed_algorithm (a preset, e.g. fedavg or fedgam+fedgh).")
        entry_grid = {**shared_grid, **_grid(entry.pop("grid", None), f"algorithms[{a_index}].grid", path)}
        # an unnamed entry with fixed fields is labelled by them too: {fed_algorithm: fedavg, server_learning_rate:
        # 0.5} is the row "fedavg-server_learning_rate0.5", distinct from a plain fedavg entry
        fixed_fields = {k: v for k, v in entry.items() if k not in ("fed_algorithm", "name")}
        # so are the parts base: gives in place of the preset's (what ran is not the preset the row would name)
        fixed_fields.update({k: base[k] for k in _changed_parts(entry["fed_algorithm"], base) if k not in entry})
        algorithm_name = str(entry.pop("name", None) or "-".join(
            [str(entry["fed_algorithm"])] + [f"{k}{_label(v)}" for k, v in fixed_fields.items()]))
        keys = list(entry_grid)
        for combo in itertools.product(*(entry_grid[k] for k in keys)):
            hyper = dict(zip(keys, combo))
            hyper_label = "_".join(f"{k}{_label(v)}" for k, v in hyper.items())
            for p_index, partition in enumerate(partitions):
                partition = _mapping(partition, f"partitions[{p_index}]", path)
                partition_name = str(partition.pop("name", None) or (
                    "_".join(f"{k}{_label(v)}" for k, v in partition.items()) if partition else base_partition))
                group = "-".join(x for x in (_label(algorithm_name), hyper_label,
                                             _label(partition_name) if len(partitions) > 1 else "") if x)
                for seed in seeds:
                    name = f"{group}-seed{seed}"
                    fields = {**fixed, **base, **partition, **entry, **hyper, "seed": seed,
                              "output_dir": os.path.join(output_dir, name)}
                    members.append(SweepMember(name=name, group=group, algorithm=algorithm_name,
                                               hyperparameters={**fixed_fields, **hyper}, partition=partition_name,
                                               seed=seed,
                                               fields=fields))
    names = [m.name for m in members]
    if len(set(names)) != len(names):
        repeated = sorted({n for n in names if names.count(n) > 1})
        _fail(path, f"two members share a name ({', '.join(repeated)}); give the algorithm entries or partitions "
                    "distinct name: keys.")
    if baseline is not None and not any(m.algorithm == baseline and not m.hyperparameters for m in members):
        _fail(path, f"baseline: {baseline!r} is not an algorithm entry without grid values "
                    f"(the entries: {', '.join(sorted({m.algorithm for m in members}))}).")
    return SweepConfig(output_dir=output_dir, members=members, metric=metric,
                       target=None if target is None else float(target), baseline=baseline, launcher=launcher,
                       submitit=_mapping(values.get("submitit"), "submitit", path), path=path,
                       conventions=conventions)


def member_config_path(config: SweepConfig, member: SweepMember) -> str:
    return os.path.join(config.output_dir, SWEEP_FOLDER, "members", f"{member.name}.json")


def load_sweep_config(path: str, *, smoke: bool = False, output_dir: str | None = None,
                      validate: bool = True) -> SweepConfig:
    """Read, expand and (``validate``) check every member as ``hf-fedflat train`` would, before anything runs.

    Each member's fields are written to its JSON config file and parsed by
    :func:`hf_fedflat.cli.parsing.parse_train_arguments` (``--config`` of that file): the same field validation as train.
    A bad member raises ``ValueError`` naming it; nothing has run yet."""
    from .parsing import read_config_file

    config = expand_members(read_config_file(path), path=path, smoke=smoke, output_dir=output_dir)
    align_conventions(config)
    if validate:
        validate_members(config)
    return config


def _parsed_member(member: SweepMember):
    """The member's ``FedTrainingArguments`` as its run will parse them (its fields through a temporary file), with
    the optimizer its model gets where it leaves ``optim`` / ``learning_rate`` unset (as ``build_experiment`` does)."""
    import tempfile

    from ..io import atomic_write_json
    from .parsing import parse_train_arguments

    with tempfile.TemporaryDirectory() as folder:
        member_path = os.path.join(folder, f"{member.name}.json")
        atomic_write_json(member.fields, member_path, durable=False)
        try:
            _, model_args, lora_args, args = parse_train_arguments(["--config", member_path])
            args.apply_model_defaults(model_args.follows_trainer_conventions, bool(lora_args.use_lora))
            return args
        except SystemExit as exit_:  # argparse's refusal of a value
            raise ValueError(f"sweep member {member.name}: its arguments were refused (see the message above).") \
                from exit_
        except (ValueError, TypeError) as error:
            raise ValueError(f"sweep member {member.name}: {error}") from error


def align_conventions(config: SweepConfig) -> None:
    """Give every member the conventions of the reference (the baseline's group, else the first that reads each):
    the aligned fields are added to the members' ``fields`` (what they run with and record), and what was aligned
    and which groups still differ goes to ``config.convention_report`` (see :mod:`hf_fedflat.cli.conventions`)."""
    from .conventions import member_conventions, plan_alignment

    groups: dict[str, SweepMember] = {}
    for member in config.members:  # one per group: the seeds of a row share its fields but seed and folder
        groups.setdefault(member.group, member)
    reference = next((m.group for m in groups.values()
                      if m.algorithm == config.baseline and not m.hyperparameters), None)
    settings = [member_conventions(group, _parsed_member(member)) for group, member in groups.items()]
    report = plan_alignment(settings, config.conventions, reference=reference,
                            opt_out="conventions: per_method (a key of the sweep file)")
    for member in config.members:
        member.fields.update(report.changes_for(member.group))
    config.convention_report = report


#: written into a member's run folder when it starts: the fields it was run with (see :func:`check_member_fields`)
MEMBER_FIELDS_FILE = "sweep_member.json"


def check_member_fields(config: SweepConfig) -> None:
    """Refuse (``ValueError``) a member whose run folder was started with other fields than the sweep now gives it
    (the sweep file was edited after a run): skipping or resuming it would mix two set-ups in one table row."""
    for member in config.members:
        path = Path(member.output_dir) / MEMBER_FIELDS_FILE
        if not path.is_file():
            continue
        try:
            ran = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        now = json.loads(json.dumps(member.fields))
        changed = sorted(k for k in set(ran) | set(now) if ran.get(k) != now.get(k))
        if changed:
            details = ", ".join(f"{k}: {ran.get(k)!r} -> {now.get(k)!r}" for k in changed)
            raise ValueError(f"sweep member {member.name}: its folder {member.output_dir} was run with other fields "
                             f"({details}); delete that folder, or give the sweep another output_dir.")


def validate_members(config: SweepConfig) -> None:
    from ..io import atomic_write_json
    from .parsing import parse_train_arguments

    check_member_fields(config)
    for member in config.members:
        member_path = member_config_path(config, member)
        atomic_write_json(member.fields, member_path)
        try:
            parse_train_arguments(["--config", member_path])[3].check_algorithm_settings()
        except SystemExit as exit_:  # argparse's refusal of a value
            raise ValueError(f"sweep member {member.name}: its arguments were refused (see the message above; "
                             f"{member_path}).") from exit_
        except (ValueError, TypeError) as error:
            raise ValueError(f"sweep member {member.name}: {error}") from error


# -------------------------------------------------------------------------------------------------
# running
# -------------------------------------------------------------------------------------------------
def member_status(output_dir: str) -> str:
    """``completed`` (run_status.json says so and final_model/ exists), ``failed`` (the run ended without training:
    run_status.json says ``failed``, see :mod:`hf_fedflat.federation.outcome`), ``resumable`` (checkpoints), ``new``.

    A failed member is an outcome, not an interruption: the sweep does not run it again (delete its folder to)."""
    from ..federation.outcome import RUN_STATUS_FILE

    status_path = os.path.join(output_dir, RUN_STATUS_FILE)
    if os.path.isfile(status_path):
        try:
            status = json.loads(Path(status_path).read_text()).get("status")
        except (OSError, ValueError):
            status = None
        if status == "completed" and os.path.isdir(os.path.join(output_dir, "final_model")):
            return "completed"
        if status == "failed":
            return "failed"
    checkpoints = os.path.join(output_dir, "checkpoints")
    if os.path.isdir(checkpoints) and any(name.startswith("round-") for name in os.listdir(checkpoints)):
        return "resumable"
    return "new"


def run_member(member_config: str) -> str:
    """Train one member from its config file (resuming from its latest checkpoint when it has one); returns its
    status afterwards (``completed`` or ``failed``). Importable and picklable: submitit runs this function."""
    from .experiment import run_experiment
    from ..federation.outcome import TrainingFailedError
    from .parsing import parse_train_arguments

    data_args, model_args, lora_args, args = parse_train_arguments(["--config", member_config])
    state = member_status(args.output_dir)
    if state in ("completed", "failed"):
        return state
    if state == "resumable":
        args.resume_from_checkpoint = "latest"
    elif state == "new":  # what a start killed before its first checkpoint left (no model, no checkpoint) is replaced
        args.overwrite_output_dir = True
    from ..io import atomic_write_json

    if not (Path(args.output_dir) / MEMBER_FIELDS_FILE).is_file():
        atomic_write_json(json.loads(Path(member_config).read_text()), os.path.join(args.output_dir, MEMBER_FIELDS_FILE))
    try:
        run_experiment(data_args, model_args, args, lora_args=lora_args)
    except TrainingFailedError as failed:
        logger.warning("sweep member %s did not train: %s", args.output_dir, failed.reason)
        return "failed"
    return member_status(args.output_dir)


def _submitit():
    try:
        import submitit
    except ImportError as error:
        raise ImportError("launcher: submitit needs the submitit package (pip install submitit), or use "
                          "launcher: local to run the members here one after another.") from error
    return submitit


def submit_members(config: SweepConfig, members: Sequence[SweepMember], *, executor=None) -> list:
    """Submit ``members`` through submitit (an ``AutoExecutor`` on ``<output_dir>/sweep/submitit`` with the
    config's ``submitit:`` parameters, unless ``executor`` is given); returns the jobs."""
    if executor is None:
        submitit = _submitit()
        executor = submitit.AutoExecutor(folder=os.path.join(config.output_dir, SWEEP_FOLDER, "submitit"))
        parameters = {"name": "hf-fedflat-sweep", **config.submitit}
        executor.update_parameters(**parameters)
    return [executor.submit(run_member, member_config_path(config, member)) for member in members]


def run_sweep(config: SweepConfig, *, executor=None, wait: bool = True) -> dict[str, str]:
    """Run (or submit) every member not finished yet, one after another; ``{member: status}``."""
    statuses: dict[str, str] = {}
    todo = []
    for member in config.members:
        state = member_status(member.output_dir)
        if state == "completed":
            logger.info("sweep: %s is complete, skipped.", member.name)
            statuses[member.name] = "skipped"
        elif state == "failed":
            logger.warning("sweep: %s ended without training (see its run_status.json); not run again (delete %s "
                           "to).", member.name, member.output_dir)
            statuses[member.name] = "failed"
        else:
            todo.append(member)
    if config.launcher == "submitit" or executor is not None:
        jobs = submit_members(config, todo, executor=executor)
        for member, job in zip(todo, jobs):
            logger.info("sweep: %s submitted (job %s).", member.name, getattr(job, "job_id", "?"))
            statuses[member.name] = "submitted"
        if wait:
            for member, job in zip(todo, jobs):
                try:
                    statuses[member.name] = job.result()
                except Exception as error:  # a failed job: recorded, the others go on
                    logger.error("sweep: %s failed: %s", member.name, error)
                    statuses[member.name] = "error"
        return statuses
    for index, member in enumerate(todo):
        logger.info("sweep: member %d/%d %s (%s)", index + 1, len(todo), member.name, member_status(member.output_dir))
        try:
            statuses[member.name] = run_member(member_config_path(config, member))
        except Exception:  # recorded; the next members still run
            logger.exception("sweep: %s raised", member.name)
            statuses[member.name] = "error"
    return statuses


# -------------------------------------------------------------------------------------------------
# table
# -------------------------------------------------------------------------------------------------
def _mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n - 1; 0 for one value); NaN when empty."""
    values = [v for v in values if v is not None and not math.isnan(v)]
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


#: the columns of :class:`~hf_fedflat.cli.summary.RunSummary` the table averages over seeds
STAT_KEYS = ("final", "best", "rounds_to_target", "seconds_to_target", "seconds_per_round", "mb_up_per_round",
             "mb_down_per_round", "mb_gossip_per_round")


def summarize_members(config: SweepConfig) -> list[dict[str, Any]]:
    """One row per group (algorithm x hyperparameters x partition): mean and std over the seeds whose run ended
    (``completed``, or ``failed``: a run that stopped training counts with its last good model, so that failures
    are not averaged away; a member still running or interrupted is left out); ``reached`` counts the seeds that
    reached the target. With a ``baseline``, ``delta_final`` / ``delta_best``: the row's value minus the baseline
    row's (same partition) of the same seed, mean and std over the seeds both have (``paired_seeds``)."""
    from ..plots import load_history

    groups: dict[str, list[SweepMember]] = {}
    for member in config.members:
        groups.setdefault(member.group, []).append(member)
    rows = []
    by_seed: dict[str, dict[int, RunSummary]] = {}
    for group, members in groups.items():
        summaries = []
        for member in members:
            history_path = Path(member.output_dir) / "history.json"
            if member_status(member.output_dir) in ("completed", "failed") and history_path.is_file():
                summaries.append(summarize_run(load_history(history_path), config.metric, config.target))
                by_seed.setdefault(group, {})[member.seed] = summaries[-1]
        first = members[0]
        report = config.convention_report
        row: dict[str, Any] = {"group": group, "algorithm": first.algorithm,
                               "hyperparameters": " ".join(f"{k}={v}" for k, v in first.hyperparameters.items()),
                               "partition": first.partition, "seeds": len(summaries), "seeds_planned": len(members),
                               "conventions": report.flag(group) if report is not None else ""}
        for key in STAT_KEYS:
            row[f"{key}_mean"], row[f"{key}_std"] = _mean_std([s[key] for s in summaries])
        row["mb_per_round_mean"], row["mb_per_round_std"] = _mean_std(
            [s["mb_up_per_round"] + s["mb_down_per_round"] + s["mb_gossip_per_round"] for s in summaries])
        row["reached"] = sum(s["rounds_to_target"] is not None for s in summaries)
        row["rounds_mean"] = statistics.fmean([s["rounds"] for s in summaries]) if summaries else math.nan
        rows.append(row)
    if config.baseline is not None:
        for row in rows:
            base_group = next((m.group for m in config.members if m.algorithm == config.baseline
                               and not m.hyperparameters and m.partition == row["partition"]), None)
            mine, theirs = by_seed.get(row["group"], {}), by_seed.get(base_group, {})
            seeds = sorted(set(mine) & set(theirs))
            row["paired_seeds"] = len(seeds)
            for key in ("final", "best"):
                row[f"delta_{key}_mean"], row[f"delta_{key}_std"] = _mean_std(
                    [mine[s][key] - theirs[s][key] for s in seeds])
    return rows


def _pm(row, key, digits) -> str:
    mean, std = row[f"{key}_mean"], row[f"{key}_std"]
    if mean is None or math.isnan(mean):
        return "-"
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def _signed(row, key, digits) -> str:
    mean, std = row.get(f"{key}_mean"), row.get(f"{key}_std")
    if mean is None or math.isnan(mean):
        return "-"
    return f"{mean:+.{digits}f} ± {std:.{digits}f}"


def format_markdown(rows: list[dict], metric: str, target: float | None, baseline: str | None = None,
                    conventions=None) -> str:
    """The table; ``conventions`` (a :class:`~hf_fedflat.cli.conventions.ConventionReport`): what was aligned, above
    it, and a column naming what a flagged row differs in besides its method."""
    short = metric.removeprefix("eval_")
    flagged = any(row.get("conventions") for row in rows)
    target_text = f" to {target:g}" if target is not None else " to target"
    paired = [f"Δ final vs {baseline}", f"Δ best vs {baseline}"] if baseline is not None else []
    header = ["algorithm", "hyperparameters", "partition", "seeds", f"final {short}", f"best {short}", *paired,
              f"rounds{target_text} (reached)", f"s{target_text}", "s/round", "MB/round (up+down+gossip)",
              *(["differs in (not the method)"] if flagged else [])]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        rounds = _pm(row, "rounds_to_target", 1)
        cells = [row["algorithm"], row["hyperparameters"] or "-", row["partition"],
                 f"{row['seeds']}/{row['seeds_planned']}", _pm(row, "final", 4), _pm(row, "best", 4),
                 *([_signed(row, "delta_final", 4), _signed(row, "delta_best", 4)] if baseline is not None else []),
                 f"{rounds} ({row['reached']}/{row['seeds']})" if target is not None else "-",
                 _pm(row, "seconds_to_target", 1) if target is not None else "-",
                 _pm(row, "seconds_per_round", 2), _pm(row, "mb_per_round", 3),
                 *([row.get("conventions") or "-"] if flagged else [])]
        lines.append("| " + " | ".join(cells) + " |")
    if conventions is not None and len(conventions.members) > 1:
        lines = [*conventions.lines(), "", *lines]
    return "\n".join(lines)


def sweep_figure(config: SweepConfig, dpi: int = 110):
    """``metric`` against the round: per group the mean over seeds and a mean +/- std band."""
    import numpy as np

    from ..plots import _new_figure, load_history, metric_series

    fig = _new_figure(7.5, 4.8, dpi)
    ax = fig.subplots()
    groups: dict[str, list[SweepMember]] = {}
    for member in config.members:
        groups.setdefault(member.group, []).append(member)
    styles = ("-", "--", ":", "-.")  # past 10 rows the colours repeat: the line style tells them apart
    for index, (group, members) in enumerate(groups.items()):
        series = {}
        for member in members:
            path = Path(member.output_dir) / "history.json"
            if member_status(member.output_dir) in ("completed", "failed") and path.is_file():
                rounds, values = metric_series(load_history(path), config.metric)
                series[member.seed] = dict(zip(rounds, values))
        if not series:
            continue
        common = sorted(set.intersection(*(set(s) for s in series.values())))
        if not common:
            continue
        table = np.array([[s[r] for r in common] for s in series.values()], dtype=float)
        mean = table.mean(axis=0)
        std = table.std(axis=0, ddof=1) if len(table) > 1 else np.zeros_like(mean)
        (line,) = ax.plot(common, mean, label=f"{group} ({len(table)} seeds)", linestyle=styles[(index // 10) % 4])
        ax.fill_between(common, mean - std, mean + std, color=line.get_color(), alpha=0.2, linewidth=0)
    ax.set_xlabel("round")
    ax.set_ylabel(config.metric)
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(loc="best", fontsize=7)
    ax.set_title(f"{config.metric}: mean over seeds, band = ± 1 std")
    return fig


def write_tables(config: SweepConfig) -> dict[str, str]:
    """``results.md``, ``results.csv`` and ``results.png`` in ``<output_dir>/sweep/`` (atomic writes)."""
    from ..io import atomic_savefig, atomic_write_text

    rows = summarize_members(config)
    folder = os.path.join(config.output_dir, SWEEP_FOLDER)
    paths = {"markdown": os.path.join(folder, "results.md"), "csv": os.path.join(folder, "results.csv"),
             "plot": os.path.join(folder, "results.png")}
    atomic_write_text(format_markdown(rows, config.metric, config.target, config.baseline, config.convention_report)
                      + "\n", paths["markdown"], durable=False)
    if config.convention_report is not None:
        from ..io import atomic_write_json

        paths["conventions"] = os.path.join(folder, "conventions.json")
        atomic_write_json({"conventions": config.convention_report.to_json()}, paths["conventions"], durable=False)
    table = io.StringIO()
    if rows:
        writer = csv.DictWriter(table, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    atomic_write_text(table.getvalue(), paths["csv"], durable=False, newline="")
    fig = sweep_figure(config)
    atomic_savefig(fig, paths["plot"])
    import matplotlib.pyplot as plt

    plt.close(fig)
    return paths


# -------------------------------------------------------------------------------------------------
# command
# -------------------------------------------------------------------------------------------------
def sweep_main(argv: Sequence[str]) -> int:
    example = __doc__.split("::\n\n", 1)[1].split("\n\n", 1)[0]
    parser = argparse.ArgumentParser(
        prog="hf-fedflat sweep", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="A grid of ordinary runs (algorithms x hyperparameters x partitions x seeds), one after another "
                    "here or through submitit, and the table a paper reports: mean +/- std over seeds of the final "
                    "and best metric, rounds and seconds to the target, s/round, MB/round (<output_dir>/sweep/"
                    "results.md, .csv, .png). Finished members are skipped, interrupted ones resume.",
        epilog="A sweep file (YAML or JSON; examples in sweeps/):\n\n" + example)
    parser.add_argument("--config", required=True, help="The sweep file (YAML or JSON).")
    parser.add_argument("--smoke", action="store_true", help="Apply the file's smoke: section (a run of seconds).")
    parser.add_argument("--output_dir", default=None, help="Instead of the file's output_dir.")
    parser.add_argument("--table_only", action="store_true", help="Write the tables from the finished members; run nothing.")
    parser.add_argument("--no_wait", action="store_true", help="submitit: submit and return (tables: --table_only later).")
    options = parser.parse_args(list(argv))
    started = time.time()
    try:
        config = load_sweep_config(options.config, smoke=options.smoke, output_dir=options.output_dir,
                                   validate=not options.table_only)
        check_member_fields(config)
    except (ValueError, FileNotFoundError, ImportError) as error:
        print(f"hf-fedflat sweep: {error}", file=sys.stderr)
        return 2
    if config.launcher == "submitit" and not options.table_only:
        try:
            _submitit()
        except ImportError as error:
            print(f"hf-fedflat sweep: {error}", file=sys.stderr)
            return 2
    logger.info("sweep: %d members (%d groups x seeds) in %s", len(config.members),
                len({m.group for m in config.members}), config.output_dir)
    if config.convention_report is not None and len(config.convention_report.members) > 1:
        logger.info("%s", "\n".join(config.convention_report.lines()))
    statuses = {} if options.table_only else run_sweep(config, wait=not options.no_wait)
    if options.no_wait and config.launcher == "submitit":
        print(f"Submitted {sum(s == 'submitted' for s in statuses.values())} members; tables later with --table_only.")
        return 0
    paths = write_tables(config)
    print(Path(paths["markdown"]).read_text())
    print(f"Wrote {', '.join(paths.values())} ({time.time() - started:.0f} s)")
    bad = sorted(name for name, status in statuses.items() if status in ("failed", "error"))
    if bad:
        print(f"hf-fedflat sweep: {len(bad)} member(s) did not complete: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


main = sweep_main
