"""How a run ended: :class:`FederatedTrainOutput`, ``run_status.json``, and :class:`TrainingFailedError` for a
run that did not train.

A run did not train when no client was aggregated for ``max_consecutive_failed_rounds`` rounds in a row
(:class:`~.client.FailurePolicy`), or in any round at all: its model is the last good one (the initial
one when no round aggregated anything), so no ``final_model/`` is written; ``run_status.json`` and the last
``history.json`` record say why, and ``hf-fedflat train`` exits with :data:`EXIT_TRAINING_FAILED`. A run that
diverged (:mod:`.divergence`) fails the same way.

``run_status.json`` says ``running`` from the moment the run holds its folder (:mod:`.run_folder`), then how it
ended: ``completed``, ``failed`` (it did not train, or diverged: exit status 3) or ``interrupted`` (an error or a
signal stopped it; ``reason`` names it; resume from its latest checkpoint). A run killed outright (``SIGKILL``, a
power cut) leaves ``running`` behind with no live holder of the folder's lock.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..io import atomic_write_json

if TYPE_CHECKING:
    import torch


@dataclass
class FederatedTrainOutput:
    """What ``FederatedTrainer.train()`` returns: the final global weights (flat), the per-round records, the
    saved model's folder, and ``transformers.TrainOutput``'s fields (a round is a step; filled by the trainer,
    see :func:`~hf_fedflat.federation.trainer_api.train_metrics`)."""

    params: torch.Tensor
    history: list[dict]
    final_model_dir: str | None
    global_step: int = 0
    training_loss: float = float("nan")
    metrics: dict[str, float] = field(default_factory=dict)


#: what ``hf-fedflat train`` exits with when the run failed with :class:`TrainingFailedError`
EXIT_TRAINING_FAILED = 3
RUN_STATUS_FILE = "run_status.json"


class TrainingFailedError(RuntimeError):
    """The run did not train (see the module docstring). Raised on every process after ``history.json`` and
    ``run_status.json`` are written; no ``final_model/`` is written.

    Attributes:
        reason: why, in one line (also ``run_status.json``'s ``reason`` and the last history record's
            ``run_failure``).
        output: the ``FederatedTrainOutput`` of the last good state (``final_model_dir`` None).
        status: the contents of ``run_status.json`` (main process; ``{}`` on the others).
    """

    def __init__(self, reason: str, output, status: dict | None = None):
        super().__init__(reason)
        self.reason, self.output, self.status = reason, output, status or {}


#: a final accuracy within this of the majority class's share, or a final eval loss above this fraction of the
#: initial model's loss, is a model that did not learn
CHANCE_ACCURACY_MARGIN = 0.01
STALLED_LOSS_FRACTION = 0.99


def learning_check(history: list[dict], *, majority_share: float | None, initial_loss: float | None) -> dict | None:
    """Whether the final global model learned: its last ``eval_accuracy`` against the chance level (predicting the
    majority class of the training rows always) and its last ``eval_loss`` against the initial model's loss (the
    divergence reference, :mod:`.divergence`). None when the run evaluated nothing to compare.

    Returns:
        ``{"learned": bool, "reason": str | None, "eval_accuracy", "majority_class_share", "eval_loss",
        "initial_loss"}`` (the numbers that were compared).
    """
    last = next((r for r in reversed(history) if "eval_accuracy" in r or "eval_loss" in r), None)
    if last is None:
        return None
    accuracy, loss = last.get("eval_accuracy"), last.get("eval_loss")
    check = {"learned": True, "reason": None, "round": last.get("round"), "eval_accuracy": accuracy,
             "majority_class_share": majority_share, "eval_loss": loss, "initial_loss": initial_loss}
    compared = False
    if isinstance(accuracy, (int, float)) and majority_share is not None:
        compared = True
        if accuracy <= majority_share + CHANCE_ACCURACY_MARGIN:
            check.update(learned=False, reason=(
                f"round {last.get('round')}'s eval_accuracy {accuracy:.4g} is at the chance level (always "
                f"predicting the majority class of the training rows scores {majority_share:.4g})"))
    if check["learned"] and isinstance(loss, (int, float)) and initial_loss:
        compared = True
        if not loss < STALLED_LOSS_FRACTION * initial_loss:  # (NaN included)
            check.update(learned=False, reason=(
                f"round {last.get('round')}'s eval_loss {loss:.4g} is not below the initial model's loss "
                f"{initial_loss:.4g}"))
    if not compared:
        return None
    if not check["learned"]:
        check["reason"] = (f"The model did not learn: {check['reason']}. Check learning_rate (too high ends at "
                           "chance, too low stalls), rho and the data; fail_if_not_learned true makes this a failure.")
    return check


def untrained_reason(history: list[dict]) -> str | None:
    """Why the run's model is not a trained one (no round aggregated any client), or None."""
    if any(record.get("num_clients", 0) > 0 for record in history):
        return None
    return (f"No round aggregated any client ({len(history)} rounds run): the model is the initial one, not a "
            "trained one, and final_model/ is not written. See failed_clients and round_failed in history.json.")


def write_run_status(output_dir: str, history: list[dict], status: str, reason: str | None,
                     final_dir: str | None, run: dict | None = None) -> dict:
    """``run_status.json``: whether the run completed and trained, and why not; returns what it wrote.

    ``run``: what identifies the run (``run_id``, ``pid``, ``host``, ``started``: :meth:`.run_folder.RunFolder.
    status_fields`), recorded with the time it ended."""
    import datetime

    aggregated = [r["round"] for r in history if r.get("num_clients", 0) > 0]
    summary = {
        "status": status,
        "reason": reason,
        **(run or {}),
        "ended": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "trained": bool(aggregated),
        "final_model": final_dir,
        "rounds_run": len(history),
        "rounds_aggregated": len(aggregated),
        "rounds_failed": len(history) - len(aggregated),
        "last_aggregated_round": aggregated[-1] if aggregated else None,
    }
    if final_dir is None and os.path.isdir(os.path.join(output_dir, "final_model")):
        summary["note"] = ("final_model/ in this folder was written when the run last completed (before it was "
                           "resumed), not at this end")
    atomic_write_json(summary, os.path.join(output_dir, RUN_STATUS_FILE), root=output_dir)
    return summary
