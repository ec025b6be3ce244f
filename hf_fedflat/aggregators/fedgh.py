"""FedGH: server-side gradient harmonization, a plug-in in front of any aggregator (``<aggregator>+fedgh``).

Reference: Zhang et al., "Tackling the Non-IID Issue in Heterogeneous Federated Learning by Gradient
Harmonization", IEEE Signal Processing Letters 2024 (FedGH).
"""

from __future__ import annotations

import dataclasses
import zlib
from dataclasses import dataclass

import torch

from ..algorithms.base import (
    EPS, Aggregator, AggregatorPlugin, ClientUpdate, PieceConfig, StateDict, Tensor, check_choice, hyperparameter,
    register_aggregator_plugin,
)

PAIRWISE, SEQUENTIAL = "pairwise", "sequential"
FEDGH_MODES = (PAIRWISE, SEQUENTIAL)


#: columns per block of the Gram matrix (20 updates x 16,384 float32 columns: ~1.3 MB, cache-sized)
GRAM_BLOCK_COLUMNS = 1 << 14


def gram_matrix(vectors: list[Tensor]) -> Tensor:
    """``G_ij = v_i . v_j`` (float64) of equally long flat vectors.

    Built block of columns by block: each block of all vectors is copied into one small reused buffer
    and multiplied by its transpose (one matrix product of cache size) and the float64 sum of the blocks
    is kept. No stacked copy of the m model-sized vectors is made (for 20 updates of the 0.58M-parameter
    benchmark CNN that copy alone was 46 MB of fresh pages per round), and the float64 sum of blocks is
    more accurate than one float32 product over all columns.
    """
    m, n = len(vectors), vectors[0].numel()
    gram = torch.zeros(m, m, dtype=torch.float64)
    width = min(GRAM_BLOCK_COLUMNS, n)
    block = torch.empty(m, width, dtype=vectors[0].dtype, device=vectors[0].device)
    for start in range(0, n, width):
        stop = min(start + width, n)
        part = block[:, : stop - start]
        for row, vector in zip(part, vectors):
            row.copy_(vector[start:stop])
        gram += (part @ part.T).double()
    return gram


def gradient_conflicts(vectors: list[Tensor]) -> tuple[Tensor, int, int]:
    """``(Gram matrix, conflicting pairs, all pairs)``; a pair conflicts when its dot product is negative."""
    gram = gram_matrix(list(vectors))
    m = gram.shape[0]
    upper = torch.triu(torch.ones(m, m, dtype=torch.bool), diagonal=1)
    return gram, int((gram[upper] < 0).sum()), int(upper.sum())


def harmonization_coefficients(vectors: list[Tensor]) -> tuple[Tensor | None, float]:
    """``(C, conflict ratio)`` with the harmonized vectors ``g_i = sum_k C_ik g~_k`` (:func:`harmonize`);
    ``C`` is None when no pair conflicts (nothing changes)."""
    gram, conflicts, pairs = gradient_conflicts(vectors)
    if conflicts == 0:
        return None, 0.0
    m = len(vectors)
    coefficients = torch.eye(m, dtype=torch.float64)
    squared = gram.diagonal().clamp_min(EPS)
    for i in range(m):
        for j in range(i + 1, m):
            if gram[i, j] >= 0:
                continue
            # both projections use the vectors as they were before this pair
            dot_i = coefficients[i] @ gram[:, j]
            dot_j = coefficients[j] @ gram[:, i]
            coefficients[i, j] -= dot_i / squared[j]
            coefficients[j, i] -= dot_j / squared[i]
    return coefficients, conflicts / max(pairs, 1)


def sequential_coefficients(vectors: list[Tensor], seed: int = 0) -> tuple[Tensor | None, float]:
    """FedGH's Algorithm 1 as ``(C, conflict ratio)``: for every client ``i``, the others ``j`` in a seeded random
    order; ``g_i -= (g_i . g~_j / ||g~_j||^2) g~_j`` when the RUNNING ``g_i`` conflicts with ``g~_j``
    (``g_i . g~_j < 0``), ``g~`` the originals. ``C`` is None when no pair of originals conflicts. The order is
    drawn from ``torch.Generator().manual_seed(seed)``, one permutation per client in client order."""
    gram, conflicts, pairs = gradient_conflicts(vectors)
    if conflicts == 0:
        return None, 0.0
    m = len(vectors)
    generator = torch.Generator().manual_seed(seed)
    coefficients = torch.eye(m, dtype=torch.float64)
    squared = gram.diagonal().clamp_min(EPS)
    for i in range(m):
        for j in torch.randperm(m, generator=generator).tolist():
            if j == i:
                continue
            dot = coefficients[i] @ gram[:, j]  # g_i (as modified so far) . g~_j
            if dot < 0:
                coefficients[i, j] -= dot / squared[j]
    return coefficients, conflicts / max(pairs, 1)


def harmonize(vectors: list[Tensor]) -> tuple[list[Tensor], float]:
    """Project every conflicting pair onto each other's normal plane; returns ``(vectors, conflict ratio)``.

    For every pair ``i < j`` (in order) whose ORIGINAL vectors conflict (``g~_i . g~_j < 0``):
    ``g_i -= (g_i . g~_j / ||g~_j||^2) g~_j`` and ``g_j -= (g_j . g~_i / ||g~_i||^2) g~_i``, with ``g`` the
    vectors as modified so far and ``g~`` the originals. The result is the same if all signs flip, so the
    updates ``Delta_i = -g_i`` are harmonized directly.

    Every harmonized ``g_i`` is a combination ``sum_k C_ik g~_k`` of the originals, and every dot product
    needed is ``(C G)_ij`` with ``G`` the Gram matrix of the originals: the pair loop runs on an m x m matrix
    and the model-sized work is the Gram matrix and one combination.
    """
    coefficients, ratio = harmonization_coefficients(vectors)
    if coefficients is None:
        return list(vectors), 0.0
    harmonized = (coefficients.to(vectors[0].dtype) @ torch.stack(vectors)).unbind(0)
    return list(harmonized), ratio


@dataclass
class FedGHConfig(PieceConfig):
    fedgh_mode: str = hyperparameter(
        PAIRWISE,
        "FedGH: 'pairwise' (every conflicting pair i<j of original updates projected onto each other's normal "
        "plane) or 'sequential' (the paper's Algorithm 1: per client, the others in a seeded random order, the "
        "conflict tested on the running vector).")

    def validate(self) -> None:
        check_choice("fedgh_mode", self.fedgh_mode, FEDGH_MODES)


def round_seed(seed: int, client_ids: list[int]) -> int:
    """The seed of a round's visiting order in ``fedgh_mode="sequential"``: the run's seed and the round's clients."""
    return zlib.crc32(repr((int(seed), [int(c) for c in client_ids])).encode())


@register_aggregator_plugin
class HarmonizedAggregator(AggregatorPlugin):
    """Harmonize the clients' updates with :func:`harmonize` (or, with ``fedgh_mode="sequential"``,
    :func:`sequential_coefficients`, seeded by :func:`round_seed`), then aggregate them with ``base``.

    When ``base`` reads the updates only through ``sum_i p_i Delta_i`` (``capabilities.linear_in_weighted_delta``: mean,
    FedAdam), the harmonized updates are never built: ``sum_i p_i Delta'_i = sum_k (C^T p)_k Delta_k``, so the
    base rule gets the original updates with the weights ``C^T p``. Other rules get the harmonized updates.

    Every other hook (the weights sent, the client learning rate, the evaluated model) is the base rule's. The
    round's conflict ratio (share of sampled pairs with negative cosine, FedGH Fig. 2) is kept in
    :attr:`last_conflict_ratio` for the diagnostics.
    """

    plugin = "fedgh"
    config_class = FedGHConfig
    run_settings = ("seed",)
    #: harmonization works on pairs of updates
    min_clients_per_round = 2

    def __init__(self, base: Aggregator, config: FedGHConfig | None = None, seed: int = 0):
        super().__init__(base, config)
        self.seed = seed
        self.last_conflict_ratio: float | None = None

    def aggregate(
        self, params: Tensor, updates: list[ClientUpdate], weights: Tensor, state: StateDict
    ) -> tuple[Tensor, StateDict]:
        deltas = [u.delta for u in updates]
        if self.config.fedgh_mode == SEQUENTIAL:
            coefficients, self.last_conflict_ratio = sequential_coefficients(
                deltas, round_seed(self.seed, [u.client_id for u in updates]))
        else:
            coefficients, self.last_conflict_ratio = harmonization_coefficients(deltas)
        if coefficients is None:
            return self.base.aggregate(params, updates, weights, state)
        if self.base.capabilities.linear_in_weighted_delta:
            return self.base.aggregate(params, updates, coefficients.T @ weights.to(torch.float64), state)
        harmonized = (coefficients.to(deltas[0].dtype) @ torch.stack(deltas)).unbind(0)
        updates = [dataclasses.replace(u, delta=d, own_delta=u.client_delta) for u, d in zip(updates, harmonized)]
        return self.base.aggregate(params, updates, weights, state)
