"""Plots of a federated run: accuracy and loss per round, and algorithms compared.

Drawn with matplotlib's object API on the Agg canvas (no pyplot, no global backend change), like
:func:`hf_fedflat.data.plot_partition_heatmap`: safe in headless runs, threads and tests. The
``*_figure`` functions return the ``Figure`` (tests read the plotted data back from its lines);
the ``plot_*`` functions draw and save a PNG.

>>> from hf_fedflat.plots import plot_history, plot_comparison
>>> plot_history("outputs/fedavg", "curves.png")                      # a run dir or its history.json
>>> plot_comparison({"fedavg": "outputs/fedavg", "fedsam": "outputs/fedsam"}, "compare.png")
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Union

__all__ = [
    "comparison_figure",
    "history_figure",
    "load_history",
    "metric_series",
    "plot_comparison",
    "plot_history",
]

HistoryLike = Union[Sequence[Mapping[str, Any]], str, os.PathLike]
"""A list of per-round records, a ``history.json`` file, or a run folder holding one."""

#: metrics drawn on the accuracy axis / the loss axis when present in the history
ACCURACY_METRICS = ("eval_accuracy", "train_accuracy", "eval_client_mean_accuracy")
LOSS_METRICS = ("train_loss", "eval_loss")


def load_history(history: HistoryLike) -> list[dict[str, Any]]:
    """Read a run's per-round records.

    Args:
        history: the records themselves, a ``history.json`` path, or a run's ``output_dir``.

    Returns:
        The list of records (a copy when a list was given).

    Raises:
        FileNotFoundError: When a folder holds no ``history.json``.
        ValueError: When the file is not a JSON list of records.
    """
    if isinstance(history, (str, os.PathLike)):
        path = Path(history)
        if path.is_dir():
            path = path / "history.json"
        if not path.is_file():
            raise FileNotFoundError(f"history: {path} does not exist; pass a run's output_dir or its history.json.")
        records = json.loads(path.read_text())
    else:
        records = list(history)
    if not isinstance(records, list) or not all(isinstance(r, Mapping) for r in records):
        raise ValueError(f"history: expected a list of per-round records (dicts), got {type(records).__name__}.")
    return [dict(r) for r in records]


def metric_series(history: Sequence[Mapping[str, Any]], metric: str) -> tuple[list[int], list[float]]:
    """``(rounds, values)`` of the records that have ``metric`` (evaluation may skip rounds)."""
    rounds, values = [], []
    for index, record in enumerate(history):
        value = record.get(metric)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            rounds.append(int(record.get("round", index + 1)))
            values.append(float(value))
    return rounds, values


def _new_figure(width: float, height: float, dpi: int):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path: str | os.PathLike) -> Path:
    from .io import atomic_savefig  # (a symbolic link at path is refused, not written through)

    return atomic_savefig(fig, Path(path))


def history_figure(history: HistoryLike, *, title: str | None = None, dpi: int = 110):
    """Accuracy (left panel) and loss (right panel) against the round.

    Each metric of :data:`ACCURACY_METRICS` / :data:`LOSS_METRICS` present in the history is one line
    (labelled with its key), drawn at the rounds where it was recorded; the best ``eval_accuracy``
    is marked.

    Args:
        history: see :func:`load_history`.
        title: figure title (default: none).
        dpi: resolution.

    Returns:
        The ``matplotlib.figure.Figure``; ``fig.axes[0]`` is accuracy, ``fig.axes[1]`` loss.

    Raises:
        ValueError: When the history holds no round with any of these metrics.
    """
    from matplotlib.ticker import MaxNLocator

    records = load_history(history)
    fig = _new_figure(10.0, 4.0, dpi)
    ax_acc, ax_loss = fig.subplots(1, 2)
    drawn = 0
    for ax, metrics, ylabel in ((ax_acc, ACCURACY_METRICS, "accuracy"), (ax_loss, LOSS_METRICS, "loss")):
        for metric in metrics:
            rounds, values = metric_series(records, metric)
            if rounds:
                ax.plot(rounds, values, label=metric, marker="o" if len(rounds) <= 30 else None, markersize=3)
                drawn += 1
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(loc="best", fontsize=8)
    if not drawn:
        raise ValueError(f"history: no round records any of {ACCURACY_METRICS + LOSS_METRICS}.")
    rounds, values = metric_series(records, "eval_accuracy")
    if values:
        best = max(range(len(values)), key=values.__getitem__)
        ax_acc.annotate(f"best {values[best]:.4f} (round {rounds[best]})", (rounds[best], values[best]),
                        textcoords="offset points", xytext=(0, -14), ha="center", fontsize=8)
    if title:
        fig.suptitle(title)
    return fig


def plot_history(history: HistoryLike, out_png: str | os.PathLike, *, title: str | None = None, dpi: int = 110) -> Path:
    """Save :func:`history_figure` as a PNG; returns the path written (parent folders are created)."""
    return _save(history_figure(history, title=title, dpi=dpi), out_png)


def comparison_figure(
    histories: Mapping[str, HistoryLike],
    metric: str = "eval_accuracy",
    *,
    x: str = "round",
    title: str | None = None,
    dpi: int = 110,
):
    """One line per run: ``metric`` against the round (or against wall-clock seconds).

    Args:
        histories: run name -> history (records, ``history.json`` or run folder); lines keep this order.
        metric: the history key to compare (``eval_accuracy``, ``eval_loss``, ``train_loss``, ...).
        x: ``"round"`` or ``"wall_seconds"`` (accuracy against time, where the algorithms differ in cost).
        title: figure title (default: the metric).
        dpi: resolution.

    Returns:
        The ``Figure``; its single axes holds one line per run that recorded ``metric``.

    Raises:
        ValueError: For an unknown ``x``, an empty mapping, or when no run recorded ``metric``.
    """
    if x not in ("round", "wall_seconds"):
        raise ValueError(f"x: must be 'round' or 'wall_seconds', got {x!r}.")
    if not histories:
        raise ValueError("histories: give at least one run (name -> history).")
    fig = _new_figure(7.0, 4.5, dpi)
    ax = fig.subplots()
    for name, history in histories.items():
        records = load_history(history)
        if x == "round":
            xs, ys = metric_series(records, metric)
        else:
            pairs = [(r.get("wall_seconds"), r.get(metric)) for r in records]
            pairs = [(float(a), float(b)) for a, b in pairs if isinstance(a, (int, float)) and isinstance(b, (int, float))]
            xs, ys = [a for a, _ in pairs], [b for _, b in pairs]
        if xs:
            ax.plot(xs, ys, label=str(name))
    if not ax.lines:
        raise ValueError(f"metric: no run records {metric!r}; check the name (e.g. eval_accuracy, eval_loss, train_loss).")
    ax.set_xlabel("round" if x == "round" else "wall-clock seconds")
    if x == "round":
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    ax.set_title(title if title is not None else metric)
    return fig


def plot_comparison(
    histories: Mapping[str, HistoryLike],
    out_png: str | os.PathLike,
    metric: str = "eval_accuracy",
    *,
    x: str = "round",
    title: str | None = None,
    dpi: int = 110,
) -> Path:
    """Save :func:`comparison_figure` as a PNG; returns the path written."""
    return _save(comparison_figure(histories, metric, x=x, title=title, dpi=dpi), out_png)
