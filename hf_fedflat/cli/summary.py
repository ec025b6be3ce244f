"""What one run's ``history.json`` says: the numbers every table of runs reports, computed in one place.

``hf-fedflat train`` and ``hf-fedflat compare`` (one row per run folder), the comparison of algorithms
(:mod:`hf_fedflat.cli.comparison`) and the sweep's table (:mod:`hf_fedflat.cli.sweep`, mean and std over seeds)
each choose their columns from :func:`summarize_run`'s :class:`RunSummary`.

>>> summary = summarize_run("outputs/fedavg")                 # a run folder, its history.json, or the records
>>> summary.final, summary.best, summary.seconds_per_round
>>> summarize_run(history, "eval_loss", target=0.8).rounds_to_target
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

__all__ = ["LOWER_IS_BETTER", "SUMMARY_METRICS", "RunSummary", "lower_is_better", "summarize_run"]

#: what a summary reports when no metric is named: the first one the history has (a language model has no accuracy)
SUMMARY_METRICS = ("eval_accuracy", "eval_perplexity", "eval_loss")
#: a metric whose name holds one of these is better lower (its best is its minimum, its target is reached from above)
LOWER_IS_BETTER = ("loss", "perplexity")
#: the name of a run whose algorithm is not recorded (no final_model/federated_config.json)
UNKNOWN = "–"


def lower_is_better(metric: str) -> bool:
    return any(word in metric for word in LOWER_IS_BETTER)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class RunSummary:
    """One run, from its per-round records.

    ``final`` / ``best`` are NaN and ``best_round`` None when ``metric`` was never evaluated. Traffic is kept as
    byte totals so that each table divides it as it always has (:meth:`megabytes_per_round`). A summary is
    also read by key (``summary["final"]``), as the dictionaries it replaces were.
    """

    metric: str
    rounds: int                        # records in the history (rounds run)
    final: float                       # the metric's last value
    best: float                        # its lowest (loss, perplexity) or highest value
    best_round: int | None             # the first round with that value
    rounds_to_target: int | None       # the first round whose value reached the target (None: not reached / none)
    seconds_to_target: float | None    # that round's wall_seconds (None when not recorded)
    seconds_per_round: float           # mean round_seconds over the records that have it (NaN: none)
    wall_seconds: float                # the last wall_seconds recorded (NaN: none)
    bytes_up: float                    # sums over the records (a record without the key sent none)
    bytes_down: float
    bytes_gossip: float                # decentralized runs: models sent between neighbours
    run: str = ""                      # the run folder's name ("" for records given directly)
    path: str | None = None            # the run folder
    algorithm: str = UNKNOWN           # final_model/federated_config.json's algorithm name

    def megabytes_per_round(self, *directions: str) -> float:
        """MB per round (over every round run) sent in ``directions`` (``"up"``, ``"down"``, ``"gossip"``) together."""
        return sum(getattr(self, f"bytes_{direction}") for direction in directions) / max(1, self.rounds) / 1e6

    @property
    def mb_up_per_round(self) -> float:
        return self.megabytes_per_round("up")

    @property
    def mb_down_per_round(self) -> float:
        return self.megabytes_per_round("down")

    @property
    def mb_gossip_per_round(self) -> float:
        return self.megabytes_per_round("gossip")

    def __getitem__(self, key: str) -> Any:
        if key not in _KEYS:
            raise KeyError(key)
        return getattr(self, key)

    def row(self, keys: Sequence[str]) -> dict[str, Any]:
        """``{key: summary[key]}`` for a table's columns."""
        return {key: self[key] for key in keys}


_KEYS = frozenset([f.name for f in fields(RunSummary)] + ["mb_up_per_round", "mb_down_per_round",
                                                          "mb_gossip_per_round"])


def summarize_run(run: str | os.PathLike | Sequence[Mapping[str, Any]], metric: str | None = None,
                  target: float | None = None, *, algorithm: str | None = None) -> RunSummary:
    """The :class:`RunSummary` of ``run``: a run folder, its ``history.json``, or its records.

    ``metric`` None: the first of :data:`SUMMARY_METRICS` the history has. ``target``: the value whose first
    reaching (``<=`` for a lower-is-better metric, else ``>=``) gives ``rounds_to_target``. ``algorithm``:
    the name to report; by default a run folder's recorded one.
    """
    from ..plots import load_history

    folder = None
    if isinstance(run, (str, os.PathLike)):
        folder = Path(run)
        if folder.is_file():
            folder = folder.parent
    history = load_history(run)
    if metric is None:
        metric = next((m for m in SUMMARY_METRICS if any(m in record for record in history)), SUMMARY_METRICS[0])
    lower = lower_is_better(metric)

    rounds, values, reached = [], [], None  # reached: (round, record) where the target was first reached
    for index, record in enumerate(history):  # the records evaluated on metric (evaluation may skip rounds)
        if not _is_number(record.get(metric)):
            continue
        rounds.append(int(record.get("round", index + 1)))
        values.append(float(record[metric]))
        if reached is None and target is not None and (values[-1] <= target if lower else values[-1] >= target):
            reached = rounds[-1], record
    best = (min if lower else max)(values) if values else math.nan
    seconds = [float(r["round_seconds"]) for r in history if _is_number(r.get("round_seconds"))]
    wall = [float(r["wall_seconds"]) for r in history if _is_number(r.get("wall_seconds"))]
    if algorithm is None:
        algorithm = UNKNOWN
        config = folder / "final_model" / "federated_config.json" if folder is not None else None
        if config is not None and config.is_file():
            algorithm = json.loads(config.read_text()).get("algorithm", {}).get("name", UNKNOWN)
    return RunSummary(
        metric=metric,
        rounds=len(history),
        final=values[-1] if values else math.nan,
        best=best,
        best_round=rounds[values.index(best)] if values else None,
        rounds_to_target=reached[0] if reached is not None else None,
        seconds_to_target=float(reached[1]["wall_seconds"]) if reached is not None and "wall_seconds" in reached[1]
        else None,
        seconds_per_round=sum(seconds) / len(seconds) if seconds else math.nan,
        wall_seconds=wall[-1] if wall else math.nan,
        bytes_up=sum(float(r.get("bytes_up", 0)) for r in history),
        bytes_down=sum(float(r.get("bytes_down", 0)) for r in history),
        bytes_gossip=sum(float(r.get("bytes_gossip", 0)) for r in history),
        run=folder.name if folder is not None else "",
        path=str(folder) if folder is not None else None,
        algorithm=algorithm,
    )
