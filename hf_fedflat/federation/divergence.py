"""A run that diverges fails: it does not end with a ``final_model/`` that looks like a result.

Before the first round the main process measures the initial model's loss on :data:`REFERENCE_ROWS` training rows
(evenly spaced over the training set; the random states are put back afterwards, so the run's numbers do not
change). A round whose train loss (the aggregated clients' weighted mean, ``history.json``'s ``train_loss``) is
NaN or Inf, or exceeds

    divergence_factor * max(1, initial loss)

stops the run as failed, and so does a round whose eval loss (the new global model's, when the round evaluates)
is: a server step (FedAdam's ``server_learning_rate``) can blow up a model whose clients trained well. Either
way (:class:`~.outcome.TrainingFailedError`: exit status 3, the reason in ``run_status.json``, the last
``history.json`` record and the log; no ``final_model/``, and that round is not checkpointed, so the last checkpoint
is the last round before it). The default factor, 1000, is far above what a normal run does: a
cross-entropy loss starts near ``ln(classes)`` and a run that learns keeps its loss below it; a loss 1000 times the
initial one (or 1000 when the initial loss is below 1) means the weights blew up (a learning rate far too high, a
bad schedule). ``divergence_factor`` 0 or None turns the check off. The reference is saved with every checkpoint, so
a resumed run keeps the bound it started with; a resume from a checkpoint without one (the run started with the
check off) measures it on the initial model, as a fresh run does.
"""

from __future__ import annotations

import logging
import math
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

logger = logging.getLogger(__name__)

__all__ = ["REFERENCE_ROWS", "DivergenceGuard"]

#: training rows the initial loss is measured on (all of them when the training set is smaller)
REFERENCE_ROWS = 256


@dataclass
class DivergenceGuard:
    """The divergence check of one run (main process).

    Args:
        factor: ``divergence_factor`` (0 or None: no check).
        reference: ``{"initial_loss": float, "rows": int}`` (measured by :meth:`measure`, or restored).
    """

    factor: float | None
    reference: dict[str, Any] | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.factor)

    @property
    def bound(self) -> float | None:
        """The train loss above which a round has diverged (None: no check, or no reference yet)."""
        if not self.enabled or self.reference is None:
            return None
        initial = self.reference.get("initial_loss")
        base = initial if isinstance(initial, (int, float)) and math.isfinite(initial) else 1.0
        return float(self.factor) * max(1.0, base)

    def measure(self, trainer, params: torch.Tensor, buffers: torch.Tensor | None = None) -> None:
        """The initial model's loss on up to :data:`REFERENCE_ROWS` training rows; every random state is
        restored afterwards."""
        if not self.enabled:
            return
        dataset = trainer.train_dataset
        count = min(REFERENCE_ROWS, len(dataset))
        if count == 0:
            return
        indices = np.unique(np.linspace(0, len(dataset) - 1, count).round().astype(np.int64)).tolist()
        rows = dataset.select(indices) if hasattr(dataset, "select") else torch.utils.data.Subset(dataset, indices)
        states = (torch.get_rng_state(), np.random.get_state(), random.getstate(),
                  torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None)
        try:
            metrics = trainer.evaluate_weights(params, buffers, dataset=rows)
        finally:
            torch.set_rng_state(states[0])
            np.random.set_state(states[1])
            random.setstate(states[2])
            if states[3] is not None:
                torch.cuda.set_rng_state_all(states[3])
        loss = metrics.get("eval_loss")
        self.reference = {"initial_loss": float(loss) if loss is not None else None, "rows": len(indices)}
        logger.info("Divergence check: a round whose train loss is NaN/Inf or above %.4g (divergence_factor %g x "
                    "max(1, the initial loss %s on %d training rows)) fails the run.", self.bound, self.factor,
                    "?" if loss is None else f"{loss:.4g}", len(indices))

    def check(self, record: dict[str, Any]) -> str | None:
        """Why the round of ``record`` diverged, or None: its train loss (the clients'), then its eval loss (the
        new global model's: a server step can blow up a model its clients trained well)."""
        if not self.enabled:
            return None
        round_number = record.get("round")
        for kind, key in (("train", "train_loss"), ("eval", "eval_loss")):
            loss = record.get(key)
            if not isinstance(loss, (int, float)):
                continue
            if not math.isfinite(loss):
                return (f"Diverged: round {round_number}'s {kind} loss is {loss} (not finite). Lower learning_rate "
                        "(or server_learning_rate; check the data and the schedule); divergence_factor 0 turns this "
                        "check off.")
            bound = self.bound
            if bound is not None and loss > bound:
                initial = self.reference.get("initial_loss")
                initial = "?" if initial is None else f"{initial:.4g}"
                return (f"Diverged: round {round_number}'s {kind} loss {loss:.4g} exceeds {bound:.4g} "
                        f"(divergence_factor {self.factor:g} x max(1, the initial model's loss {initial} on "
                        f"{self.reference['rows']} training rows)). Lower learning_rate (or server_learning_rate), "
                        "or raise divergence_factor (0 turns the check off).")
        return None
