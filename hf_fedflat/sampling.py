"""Seeded client sampling and seeds derived per (round, client).

Randomness is derived from ``(seed, round[, client])`` instead of being drawn from a running
generator: a resumed run, a run on any number of processes and an uninterrupted run then make the
same draws with no RNG state to save.
"""

from __future__ import annotations

import numpy as np


def derive_seed(*parts: int) -> int:
    """A 31-bit seed that depends on every part (stable across processes and Python versions)."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0] & 0x7FFFFFFF)


def sample_clients(num_clients: int, clients_per_round: int, seed: int, round_index: int) -> list[int]:
    """``clients_per_round`` distinct client ids for round ``round_index``, sorted."""
    if not 1 <= clients_per_round <= num_clients:
        raise ValueError(f"clients_per_round must be in [1, num_clients={num_clients}], got {clients_per_round}.")
    if clients_per_round == num_clients:
        return list(range(num_clients))
    rng = np.random.default_rng(derive_seed(seed, round_index, 0x5A3))
    return sorted(int(c) for c in rng.choice(num_clients, size=clients_per_round, replace=False))
