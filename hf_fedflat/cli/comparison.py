"""Run several algorithms on the same data, partition, seed and initial model, and tabulate them.

Used by ``recipes/compare_algorithms.py`` and the quickstart's comparison mode. Each run writes its own
folder (``history.json``, ``final_model/`` ...); the table reports final/best accuracy, rounds and time to a
target accuracy, seconds per round and its ratio to FedAvg, gradient passes per step and bytes per round.
By default the members share one value of every convention (the first algorithm's: aggregation weights, ...),
so that they differ only in their methods (:mod:`hf_fedflat.cli.conventions`); ``conventions="per_method"``
keeps each preset's own, and the table then flags the members that differ in more than their method.
"""

from __future__ import annotations

import csv
import io
import logging
import os
from typing import Any, Callable

from transformers import set_seed

from ..algorithms import build_algorithm
from ..config import FedTrainingArguments
from .conventions import ConventionReport, check_convention_mode, member_conventions, plan_alignment
from .summary import RunSummary, summarize_run

logger = logging.getLogger(__name__)

COLUMNS = (
    ("algorithm", "algorithm", "{}"),
    ("final_accuracy", "final acc", "{:.4f}"),
    ("best_accuracy", "best acc", "{:.4f}"),
    ("rounds_to_target", "rounds to target", "{}"),
    ("seconds_to_target", "s to target", "{:.1f}"),
    ("seconds_per_round", "s/round", "{:.3f}"),
    ("time_vs_fedavg", "time vs fedavg", "{:.2f}x"),
    ("passes_per_step", "passes/step", "{}"),
    ("megabytes_per_round", "MB/round (up+down)", "{:.3f}"),
)
#: the column of a table whose members differ in more than their methods (and the CSV's, always)
CONVENTIONS_COLUMN = ("conventions", "differs in (not the method)", "{}")


class ComparisonTable(list):
    """The rows of a comparison (a list of dicts), with ``conventions``: what was aligned and who differs."""

    conventions: ConventionReport | None = None


def comparison_row(algorithm: str, summary: RunSummary, passes_per_step: int) -> dict[str, Any]:
    """One table row (before ``time_vs_fedavg``) from a run's :class:`~hf_fedflat.cli.summary.RunSummary` on
    ``eval_accuracy``; the traffic is a server run's, up and down."""
    return {
        "algorithm": algorithm,
        "final_accuracy": summary.final,
        "best_accuracy": summary.best,
        "rounds_to_target": summary.rounds_to_target,
        "seconds_to_target": summary.seconds_to_target,
        "seconds_per_round": summary.seconds_per_round,
        "passes_per_step": passes_per_step,
        "megabytes_per_round": summary.megabytes_per_round("up", "down"),
    }


def add_time_ratios(rows: list[dict]) -> list[dict]:
    """``time_vs_fedavg``: seconds per round over FedAvg's (over the first row's when FedAvg is absent)."""
    base = next((r for r in rows if r["algorithm"] == "fedavg"), rows[0])["seconds_per_round"]
    for row in rows:
        row["time_vs_fedavg"] = row["seconds_per_round"] / base if base else float("nan")
    return rows


def run_comparison(
    args: FedTrainingArguments,
    algorithms: list[str],
    make_model: Callable[[], Any],
    train_dataset,
    eval_dataset,
    *,
    partition=None,
    label_column: str = "label",
    trainer_factory: Callable[..., Any] | None = None,
    single_run: bool = False,
    conventions: str = "aligned",
    opt_out: str = "--conventions per_method",
) -> tuple[list[dict], dict[str, list[dict]]]:
    """Train every algorithm from the same initial model on the same partition; ``(rows, histories)``.

    ``args`` is the shared configuration; each algorithm gets ``args.with_algorithm(name)`` (its preset's
    defaults apply where the user set nothing) and the sub-folder ``<output_dir>/<name>``; with
    ``single_run`` the one algorithm of ``args`` runs in ``output_dir`` itself. With ``conventions="aligned"``
    (default) the conventions the user left unset take the first algorithm's value in every member
    (:mod:`hf_fedflat.cli.conventions`; ``"per_method"``: each preset's own); the summary is logged and the rows
    (a :class:`ComparisonTable`) carry it as ``rows.conventions``, and each row its flag (``conventions``).
    Every algorithm's settings are checked before the first one trains (an unknown name, or a setting that
    contradicts one of them, raises ``ConfigError``). A row's ``algorithm`` is what ran: the name, with any part
    given in place of the preset's (``FedTrainingArguments.algorithm_label``). ``opt_out`` is how the caller's
    user asks for ``per_method`` (shown in the summary).
    """
    from ..field_checks import ConfigError

    try:
        check_convention_mode("conventions", conventions)
    except ValueError as error:
        raise ConfigError(str(error)) from error

    def member_args(name: str, changes: dict[str, Any]):
        try:
            run_args = args if single_run else args.with_algorithm(
                name, output_dir=os.path.join(args.output_dir, name.replace("+", "_")), **changes)
            run_args.check_algorithm_settings()
        except ConfigError:
            raise
        except ValueError as error:  # an unknown preset: the field checks' one error type
            raise ConfigError(str(error)) from error
        return run_args

    members = {name: member_args(name, {}) for name in algorithms}
    report = plan_alignment([member_conventions(name, run_args) for name, run_args in members.items()],
                            conventions, opt_out=opt_out)
    for name in members:
        changes = report.changes_for(name)
        if changes:  # the conventions the user left to the preset, given the first member's value
            members[name] = member_args(name, changes)
    if len(members) > 1:
        logger.info("%s", "\n".join(report.lines()))
    if trainer_factory is None:  # a server loop, or gossip for the decentralized presets
        from ..federation.trainer_factory import create_trainer as trainer_factory
    if partition is None:
        from ..data import partition_dataset

        partition = partition_dataset(
            train_dataset, args.num_clients, args.partition_scheme, label_column=label_column,
            alpha=args.dirichlet_alpha, classes_per_client=args.classes_per_client,
            min_partition_size=args.min_partition_size, seed=args.effective_partition_seed,
        )
    rows, histories = ComparisonTable(), {}
    rows.conventions = report
    for name, run_args in members.items():
        set_seed(args.seed)  # the same initial model for every algorithm
        trainer = trainer_factory(make_model(), run_args, train_dataset, eval_dataset, partition=partition,
                                  label_column=label_column)
        output = trainer.train()
        label = run_args.algorithm_label
        histories[label] = output.history
        summary = summarize_run(output.history, "eval_accuracy", args.target_accuracy)
        rows.append({**comparison_row(label, summary, build_algorithm(run_args).passes_per_step),
                     "conventions": report.flag(name)})
    add_time_ratios(rows)
    return rows, histories


def format_markdown(rows: list[dict]) -> str:
    """The table; above it, when ``rows`` is a :class:`ComparisonTable` of several members, what was aligned and who
    differs in more than the method (a column then names it)."""
    report = getattr(rows, "conventions", None)
    columns = COLUMNS + ((CONVENTIONS_COLUMN,) if any(row.get("conventions") for row in rows) else ())
    header = "| " + " | ".join(title for _, title, _ in columns) + " |"
    lines = [header, "|" + "---|" * len(columns)]
    for row in rows:
        cells = [("-" if row.get(key) is None else fmt.format(row[key])) for key, _, fmt in columns]
        lines.append("| " + " | ".join(cells) + " |")
    if report is not None and len(report.members) > 1:
        lines = [*report.lines(), "", *lines]
    return "\n".join(lines)


def write_comparison(rows: list[dict], histories: dict[str, list[dict]], output_dir: str) -> dict[str, str]:
    """``results.md``, ``results.csv``, ``accuracy_curves.png`` and (rows of :func:`run_comparison`)
    ``comparison.json``, what was aligned and who differs, in ``output_dir``."""
    from ..plots import plot_comparison

    os.makedirs(output_dir, exist_ok=True)
    paths = {"markdown": os.path.join(output_dir, "results.md"), "csv": os.path.join(output_dir, "results.csv"),
             "plot": os.path.join(output_dir, "accuracy_curves.png")}
    from ..io import atomic_write_json, atomic_write_text  # never through a symbolic link at the path

    atomic_write_text(format_markdown(rows) + "\n", paths["markdown"], durable=False)
    report = getattr(rows, "conventions", None)
    if report is not None:
        paths["conventions"] = os.path.join(output_dir, "comparison.json")
        atomic_write_json({"conventions": report.to_json()}, paths["conventions"])
    columns = COLUMNS + (CONVENTIONS_COLUMN,)
    table = io.StringIO()
    writer = csv.DictWriter(table, fieldnames=[key for key, _, _ in columns])
    writer.writeheader()
    writer.writerows([{key: row.get(key) for key, _, _ in columns} for row in rows])
    atomic_write_text(table.getvalue(), paths["csv"], durable=False, newline="")
    if any(any("eval_accuracy" in r for r in h) for h in histories.values()):
        plot_comparison(histories, paths["plot"], "eval_accuracy", title="Test accuracy of the global model")
    return paths
