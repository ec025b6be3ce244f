"""What a run says when it starts: the settings in effect and how the labels fall on the clients.

A short block, on the main process, once per start (a resumed run says it again): the algorithm, the local
optimizer, its learning rate and schedule (and where unset values came from), the batch size and local work, the
partition, and a per-client label summary. When most clients hold essentially one class the run warns and names
the flags that spread the labels (``--dirichlet_alpha``, ``--classes_per_client``, ``--partition_scheme iid``):
local training then fits one class per client and the global model may stay near chance for many rounds.

>>> summary = client_label_summary(partition.label_counts)   # counts: [clients, classes]
>>> summary.classes_held, summary.one_class_clients
>>> text, warning = start_of_run_summary(trainer.args, trainer.partition)

The counts are the partition's ``[clients, classes]`` matrix, reduced column-wise: thousands of clients cost a few
vectorised passes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..callbacks import FederatedCallback

__all__ = ["ONE_CLASS_SHARE", "LabelSummary", "StartSummaryCallback", "client_label_summary", "start_of_run_summary"]

logger = logging.getLogger(__name__)

#: a client whose largest class holds at least this share of its rows "holds essentially one class"
ONE_CLASS_SHARE = 0.9


@dataclass(frozen=True)
class LabelSummary:
    """How the classes fall on the clients (clients without rows left out of every number but ``empty_clients``)."""

    num_classes: int
    clients_with_rows: int
    empty_clients: int
    #: classes with at least one row, per client: (min, median, max)
    classes_held: tuple[int, float, int]
    #: clients whose largest class holds >= ONE_CLASS_SHARE of their rows
    one_class_clients: int

    @property
    def one_class_fraction(self) -> float:
        """Share of the clients (with rows) that hold essentially one class."""
        return self.one_class_clients / self.clients_with_rows if self.clients_with_rows else 0.0

    @property
    def mostly_one_class(self) -> bool:
        """More than half of the clients hold essentially one class (of a task with several)."""
        return self.num_classes > 1 and self.one_class_fraction > 0.5


def client_label_summary(label_counts: Any) -> LabelSummary:
    """The :class:`LabelSummary` of a ``[clients, classes]`` matrix of row counts."""
    counts = np.asarray(label_counts, dtype=np.int64)
    if counts.ndim != 2:
        raise ValueError(f"label_counts: a [clients, classes] matrix, got shape {counts.shape}.")
    rows = counts.sum(axis=1)
    present = counts[rows > 0]
    held = (present > 0).sum(axis=1)
    largest = present.max(axis=1, initial=0)
    one_class = int((largest >= ONE_CLASS_SHARE * present.sum(axis=1)).sum())
    stats = (int(held.min()), float(np.median(held)), int(held.max())) if held.size else (0, 0.0, 0)
    return LabelSummary(num_classes=int(counts.shape[1]), clients_with_rows=int(present.shape[0]),
                        empty_clients=int((rows == 0).sum()), classes_held=stats, one_class_clients=one_class)


def _remedy(partition) -> str:
    """What spreads the labels, in the flags of the partition's scheme."""
    if partition.alpha is not None:  # the Dirichlet schemes
        return f"raise --dirichlet_alpha (now {partition.alpha:g}; 1.0 or more mixes classes) or use --partition_scheme iid"
    if partition.classes_per_client is not None:
        return f"raise --classes_per_client (now {partition.classes_per_client}) or use --partition_scheme iid"
    if partition.scheme in ("iid", "linear"):  # split by rows: the data itself is nearly one class
        return "the data itself is nearly one class; check the label column (--label_column)"
    return "this split comes with the data (one client per id); use --partition_scheme iid to spread the classes"


def _decentralized(aggregator: str) -> bool:
    from ..aggregators.gossip import is_decentralized
    from ..algorithms.registry import AGGREGATORS, split_plugins

    return is_decentralized(AGGREGATORS[split_plugins(aggregator)[0]])


def _number(value: float) -> str:
    return f"{value:g}"


def _count(value: float, noun: str) -> str:
    return f"{_number(value)} {noun}{'' if value == 1 else 's'}"


def _privacy_line(args, aggregator: str) -> str | None:
    """The client-level DP set-up of a run whose server rule releases a noised mean (``+dp``), with the epsilon that
    ``num_rounds`` rounds spend; None for other runs."""
    from ..algorithms.registry import AGGREGATOR_PLUGINS, split_plugins
    from ..privacy import ClientLevelAccountant

    if not any(AGGREGATOR_PLUGINS[p].capabilities.noised_release for p in split_plugins(aggregator)[1]):
        return None
    rate = args.num_clients_per_round / args.num_clients
    spent = ClientLevelAccountant(args.dp_noise_multiplier, rate, args.dp_delta).epsilon(args.num_rounds)
    budget = f", budget {_number(args.dp_target_epsilon)}" if args.dp_target_epsilon is not None else ""
    return (f"  privacy: client-level DP, clip norm {_number(args.dp_clip_norm)}, noise multiplier "
            f"{args.dp_noise_multiplier:.4g} added {'on the clients' if args.dp_noise == 'client' else 'by the server'}, "
            f"Poisson sampling q = {rate:.4g}; epsilon {spent:.4g} at delta {args.dp_delta:.3g} after "
            f"{_count(args.num_rounds, 'round')}{budget}")


def start_of_run_summary(args, partition) -> tuple[str, str | None]:
    """``(the summary block, a warning or None)`` for a run of ``args`` (``FedTrainingArguments``) over
    ``partition`` (a :class:`~hf_fedflat.data.partition.ClientPartition`)."""
    from ..algorithms import resolve_parts

    perturbation, corrections, aggregator = resolve_parts(args.fed_algorithm, args.perturbation, args.corrections,
                                                          args.aggregator)
    optim = str(getattr(args.optim, "value", args.optim))
    schedule = str(getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type))
    decay = f", x{_number(args.lr_decay_per_round)} per round" if args.lr_decay_per_round != 1 else ""
    work = (_count(args.local_steps, "local step") if args.local_steps is not None
            else _count(args.local_epochs, "local epoch"))
    batch = f"batch {args.per_device_train_batch_size}"
    if args.gradient_accumulation_steps > 1:
        batch += f" x {args.gradient_accumulation_steps} accumulated"
    sizes = np.asarray(partition.num_samples)
    lines = [
        f"Run: {args.algorithm_label} (perturbation {perturbation}, corrections {', '.join(corrections) or '-'}, "
        f"aggregator {aggregator}), {_count(args.num_rounds, 'round')}",
        f"  local training: {optim}, learning_rate {_number(args.learning_rate)} ({schedule} within a round{decay}); "
        f"{batch}, {work} per round",
    ]
    note = getattr(args, "optimizer_defaults_note", "")
    if note:
        lines.append(f"  unset, so by default: {note}")
    per_round = f"{args.num_clients_per_round} per round"
    if _decentralized(aggregator) and args.decentralized_participation == "full":
        per_round = "all train every round (gossip)"
    lines.append(f"  partition: {partition.describe_scheme()}, {partition.num_clients} clients, "
                 f"{per_round}; rows per client min {int(sizes.min())} / median "
                 f"{_number(float(np.median(sizes)))} / max {int(sizes.max())}")
    privacy = _privacy_line(args, aggregator)
    if privacy:
        lines.append(privacy)
    labels = client_label_summary(partition.label_counts)
    warning = None
    if labels.num_classes > 1:
        low, median, high = labels.classes_held
        lines.append(f"  labels: {labels.num_classes} classes; classes per client min {low} / median {_number(median)} "
                     f"/ max {high}; {labels.one_class_clients} of {labels.clients_with_rows} clients "
                     f"({labels.one_class_fraction:.0%}) have >= {ONE_CLASS_SHARE:.0%} of their rows in one class")
        if labels.mostly_one_class:
            warning = (f"Most clients ({labels.one_class_clients} of {labels.clients_with_rows}) hold essentially one "
                       f"class (>= {ONE_CLASS_SHARE:.0%} of their rows): local training fits that class and the "
                       f"global model may stay near chance for many rounds. To spread the labels, "
                       f"{_remedy(partition)}.")
    return "\n".join(lines), warning


class StartSummaryCallback(FederatedCallback):
    """Logs :func:`start_of_run_summary` when training starts (the main process calls ``on_train_begin``), and
    prints it where INFO logs are not shown (a Python caller that configured no logging); the warning is logged
    as a warning."""

    def on_train_begin(self, trainer, **kwargs: Any) -> None:
        text, warning = start_of_run_summary(trainer.args, trainer.partition)
        if logger.isEnabledFor(logging.INFO) and logger.hasHandlers():
            logger.info(text)
        else:
            print(text, flush=True)
        if warning is not None:
            logger.warning(warning)
