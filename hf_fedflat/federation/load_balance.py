"""Which process trains which of a round's clients: predicted work, balanced greedily.

A round ends when the slowest process has trained its clients, so the split should give every process
the same *time*, not the same number of clients or samples. Time follows a client's local schedule:
with a fixed number of local steps every client with at least a batch of data does the same work
however many rows it holds, and a client smaller than a batch forwards fewer samples per step. So the
predicted cost of a client is ``c + a * optimizer_steps + b * samples_forwarded``, where the steps and
samples come from the Trainer's own schedule (:func:`local_work`) and ``(c, a, b)`` are fit by
non-negative least squares to the client times measured in earlier rounds (:class:`ClientCostModel`):
the per-step share (optimizer, Python, a new epoch for tiny clients) and the per-sample share (forward
and backward) differ by model, algorithm (SAM doubles both) and machine. Until a few clients have been
timed the cost is the number of samples forwarded.

The assignment never changes the result: clients are seeded by ``(seed, round, client)`` and the server
orders updates by client id, so only the wall time depends on it.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Mapping, Sequence

import numpy as np

__all__ = ["ClientCostModel", "assign_to_processes", "local_work"]


def local_work(
    num_samples: int,
    batch_size: int,
    *,
    local_steps: int | None = None,
    local_epochs: float = 1.0,
    gradient_accumulation_steps: int = 1,
    drop_last: bool = False,
) -> tuple[int, int]:
    """``(optimizer steps, samples forwarded)`` of one client's local run, following ``Trainer``'s schedule.

    Batches per epoch: ``ceil(n / batch)`` (``floor`` with ``drop_last``), the last one short. An optimizer
    step takes ``gradient_accumulation_steps`` batches, fewer at the end of an epoch. The run stops after
    ``local_steps`` optimizer steps, or ``ceil(local_epochs * steps per epoch)`` of them, cycling through
    epochs as the Trainer does.
    """
    accumulation = max(1, gradient_accumulation_steps)
    full, rest = divmod(num_samples, batch_size)
    batches = [batch_size] * full + ([rest] if rest and not drop_last else [])
    if not batches:
        return 0, 0
    steps_per_epoch = math.ceil(len(batches) / accumulation)
    max_steps = local_steps if local_steps is not None else math.ceil(local_epochs * steps_per_epoch)
    epochs, last_epoch_steps = divmod(max_steps, steps_per_epoch)
    samples = epochs * sum(batches) + sum(batches[: last_epoch_steps * accumulation])
    return max_steps, samples


class ClientCostModel:
    """Seconds a client takes, ``c + a * steps + b * samples``, fit to the last ``window`` timed clients."""

    #: timed clients before the fit is used (with fewer, costs are the samples forwarded)
    MIN_OBSERVATIONS = 4

    def __init__(self, window: int = 512):
        self._observations: collections.deque[tuple[float, float, float]] = collections.deque(maxlen=window)
        self._coefficients: np.ndarray | None = None

    def observe(self, steps: int, samples: int, seconds: float) -> None:
        if seconds > 0 and math.isfinite(seconds):
            self._observations.append((float(steps), float(samples), float(seconds)))
            self._coefficients = None

    @property
    def coefficients(self) -> tuple[float, float, float] | None:
        """``(c, a, b)``: seconds per client, per optimizer step and per sample; ``None`` before the fit."""
        if len(self._observations) < self.MIN_OBSERVATIONS:
            return None
        if self._coefficients is None:
            from scipy.optimize import nnls

            data = np.asarray(self._observations)
            design = np.column_stack([np.ones(len(data)), data[:, 0], data[:, 1]])
            scale = np.maximum(design.max(axis=0), 1e-12)  # columns of comparable size for the solver
            solution, _ = nnls(design / scale, data[:, 2])
            self._coefficients = solution / scale
        return tuple(float(x) for x in self._coefficients)

    def cost(self, steps: int, samples: int) -> float:
        fit = self.coefficients
        if fit is None:
            return float(samples)
        c, a, b = fit
        return c + a * steps + b * samples


def assign_to_processes(client_ids: list[int], costs: Sequence[float] | Mapping[int, float],
                        world_size: int) -> list[list[int]]:
    """Split a round's clients across processes, balancing their costs (most expensive first, greedy).

    ``costs[client_id]``: predicted work of the client (any unit). Deterministic for given costs. The
    result keeps no order meaning: the server re-orders updates by client id before aggregating.
    """
    loads = [0.0] * world_size
    shares: list[list[int]] = [[] for _ in range(world_size)]
    for client_id in sorted(client_ids, key=lambda c: (-costs[c], c)):
        target = min(range(world_size), key=lambda r: (loads[r], len(shares[r]), r))
        shares[target].append(client_id)
        loads[target] += costs[client_id]
    return [sorted(share) for share in shares]
