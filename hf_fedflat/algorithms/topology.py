"""Communication graphs of decentralized runs and their mixing matrices.

A gossip step replaces every client's model by a weighted average of its neighbours' and its own:
``x_i <- sum_j W_ij z_j``. ``W`` is the *mixing matrix*: row ``i`` holds the weights client ``i`` gives
to the models it receives. How fast repeated gossip reaches consensus is governed by the spectral gap
``1 - max(|lambda_2|, |lambda_N|)`` of ``W`` (Boyd et al., "Randomized gossip algorithms", IEEE TIT
2006; Lian et al., D-PSGD, NeurIPS 2017): for a symmetric doubly stochastic ``W`` and any models
``X``, ``||W X - x_bar|| <= (1 - gap) ||X - x_bar||``.

Every builder returns a plain ``numpy`` matrix; :func:`validate_mixing_matrix` checks it (non-negative,
rows summing to 1, and symmetric or doubly stochastic where the topology claims it) and
:class:`Topology` hands out the matrix of each round (fixed, or re-drawn per round from a seed derived
from ``(seed, round)`` so a resumed run and any process count see the same graphs).

| topology | weights | kind |
|---|---|---|
| ring | 1/3 to itself and to each of its two neighbours | symmetric |
| full | 1/N to everyone | symmetric |
| exponential | uniform over itself and clients ``i + 2^k mod N`` | doubly stochastic, not symmetric |
| random_regular | 1/(k+1) to itself and its k neighbours of a random k-regular graph | symmetric |
| graph | Metropolis-Hastings on given undirected edges | symmetric |
| random_k_out | 1/(k+1) to itself and k random others (the public DFL code's "random") | row-stochastic only |
"""

from __future__ import annotations

import json
import logging
import os
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cached_property
from itertools import combinations
from typing import Callable, Iterable

import numpy as np

from ..sampling import derive_seed

logger = logging.getLogger(__name__)

SYMMETRIC = "symmetric"
DOUBLY_STOCHASTIC = "doubly_stochastic"
ROW_STOCHASTIC = "row_stochastic"
MATRIX_KINDS = (SYMMETRIC, DOUBLY_STOCHASTIC, ROW_STOCHASTIC)
_TOL = 1e-9
_TOPOLOGY_STREAM = 0x70B0  # separates topology draws from client sampling in derive_seed


# --- deterministic topologies ---------------------------------------------------------------------
def fully_connected(num_clients: int) -> np.ndarray:
    """``W_ij = 1/N``: one gossip step is exact averaging (the FedAvg mean with uniform weights)."""
    _check_num_clients(num_clients)
    return np.full((num_clients, num_clients), 1.0 / num_clients)


def ring(num_clients: int) -> np.ndarray:
    """Client ``i`` averages itself and clients ``i-1``, ``i+1`` (mod N) with weight 1/3 each.

    With N <= 3 every client neighbours every other one: the ring is the complete graph, and its
    weights are ``1/N`` (for N=2 the two neighbours coincide; weighting that one client 2/3 would make
    the ring slower than the edge it is).
    """
    _check_num_clients(num_clients)
    if num_clients <= 3:
        return fully_connected(num_clients)
    weights = np.zeros((num_clients, num_clients))
    for i in range(num_clients):
        for j in (i - 1, i, i + 1):
            weights[i, j % num_clients] = 1.0 / 3.0
    return weights


def exponential(num_clients: int) -> np.ndarray:
    """Client ``i`` averages itself and clients ``i + 2^k mod N`` for every ``2^k < N``, uniformly.

    The one-peer-per-power-of-two graph of Assran et al. (SGP, ICML 2019) and Ying et al. (NeurIPS 2021):
    ``log2(N)`` neighbours and a spectral gap that shrinks only like ``1/log N``. The matrix is circulant,
    hence doubly stochastic (gossip keeps the average model) and normal (the consensus bound of the
    spectral gap holds), but it is not symmetric: ``i`` listens to ``i + 2^k``, which listens to ``i + 2^{k+1}``.
    """
    _check_num_clients(num_clients)
    offsets = [0] + [2**k for k in range(num_clients.bit_length()) if 2**k < num_clients]
    weights = np.zeros((num_clients, num_clients))
    for i in range(num_clients):
        for offset in offsets:
            weights[i, (i + offset) % num_clients] = 1.0 / len(offsets)
    return weights


def metropolis_hastings(num_clients: int, edges: Iterable[tuple[int, int]]) -> np.ndarray:
    """Metropolis-Hastings weights of an undirected graph: ``W_ij = 1/(1 + max(d_i, d_j))`` on edges,
    ``W_ii = 1 - sum_{j != i} W_ij``.

    Symmetric and doubly stochastic for any graph, using only each client's and its neighbours' degrees
    (Xiao & Boyd, "Fast linear iterations for distributed averaging", 2004). Repeated edges count once.
    """
    _check_num_clients(num_clients)
    pairs = _undirected_edges(num_clients, edges)
    degree = np.zeros(num_clients, dtype=np.int64)
    for i, j in pairs:
        degree[i] += 1
        degree[j] += 1
    weights = np.zeros((num_clients, num_clients))
    for i, j in pairs:
        weights[i, j] = weights[j, i] = 1.0 / (1 + max(degree[i], degree[j]))
    np.fill_diagonal(weights, 1.0 - weights.sum(axis=1))
    return weights


def uniform_neighbour_weights(num_clients: int, edges: Iterable[tuple[int, int]]) -> np.ndarray:
    """``W_ij = 1/(d_i + 1)`` over ``i`` and its neighbours: symmetric exactly when the graph is regular."""
    _check_num_clients(num_clients)
    adjacency = np.eye(num_clients)
    for i, j in _undirected_edges(num_clients, edges):
        adjacency[i, j] = adjacency[j, i] = 1.0
    return adjacency / adjacency.sum(axis=1, keepdims=True)


# --- random topologies ----------------------------------------------------------------------------
def random_regular(num_clients: int, degree: int, rng: np.random.Generator, max_draws: int = 100) -> np.ndarray:
    """Weights ``1/(k+1)`` on itself and its ``k`` neighbours in a random k-regular graph.

    The graph is drawn by pairing stubs (each client holds ``k`` of them) and pairing again only the
    stubs whose pairs made a self-loop or a repeated edge, restarting when no valid pair is left
    (Steger & Wormald, 1999; the method of ``networkx.random_regular_graph``, written here so a seed gives
    the same graph whatever is installed). Dense graphs (``2k > N-1``) are drawn as the complement of a
    random ``(N-1-k)``-regular graph. Draws are repeated (up to ``max_draws``) until the graph is
    connected, since gossip on a disconnected graph never reaches consensus; a 1-regular graph (a
    matching) is connected only for N=2.
    """
    _check_num_clients(num_clients)
    check_regular_degree(num_clients, degree)
    complement = 2 * degree > num_clients - 1
    drawn_degree = num_clients - 1 - degree if complement else degree
    edges: set[tuple[int, int]] = set()
    for _ in range(max_draws):
        edges = _random_regular_edges(num_clients, drawn_degree, rng)
        if complement:
            edges = {pair for pair in combinations(range(num_clients), 2) if pair not in edges}
        if _connected(num_clients, edges):
            break
    else:
        logger.warning("No connected %d-regular graph on %d clients in %d draws; using a disconnected one (spectral "
                       "gap 0: clients in different components never reach consensus).", degree, num_clients, max_draws)
    return uniform_neighbour_weights(num_clients, edges)


def check_regular_degree(num_clients: int, degree: int) -> None:
    """Raise unless a ``degree``-regular graph on ``num_clients`` clients exists."""
    if not 0 <= degree < num_clients:
        raise ValueError(f"topology_degree: a {degree}-regular graph on {num_clients} clients needs 0 <= degree < "
                         f"num_clients; use at most {num_clients - 1}.")
    if (num_clients * degree) % 2:
        raise ValueError(
            f"topology_degree: no {degree}-regular graph on {num_clients} clients exists (num_clients * degree must "
            f"be even); use {degree - 1} or {degree + 1}, or an even num_clients."
        )


def random_k_out(num_clients: int, degree: int, rng: np.random.Generator) -> np.ndarray:
    """Every client averages itself and ``k`` clients it picks at random, weights ``1/(k+1)``.

    The "random" topology of the public DFL code (DisPFL, DFedSAM: each client picks its neighbours
    independently). Row-stochastic only: the choice is one-sided, so ``W`` is neither symmetric nor
    column-stochastic and gossip does not keep the average model.
    """
    _check_num_clients(num_clients)
    if not 0 <= degree < num_clients:
        raise ValueError(f"topology_degree: each of {num_clients} clients can pick at most {num_clients - 1} others, "
                         f"got {degree}.")
    weights = np.zeros((num_clients, num_clients))
    for i in range(num_clients):
        others = np.delete(np.arange(num_clients), i)
        picked = rng.choice(others, size=degree, replace=False) if degree else np.empty(0, dtype=np.int64)
        weights[i, picked] = 1.0 / (degree + 1)
        weights[i, i] = 1.0 / (degree + 1)
    return weights


def _random_regular_edges(num_clients: int, degree: int, rng: np.random.Generator, max_restarts: int = 1000):
    if degree == 0:
        return set()
    for _ in range(max_restarts):
        edges: set[tuple[int, int]] = set()
        stubs = np.repeat(np.arange(num_clients), degree)
        while stubs.size:
            rng.shuffle(stubs)
            leftover: dict[int, int] = defaultdict(int)
            for a, b in zip(stubs[0::2].tolist(), stubs[1::2].tolist()):
                pair = (min(a, b), max(a, b))
                if a != b and pair not in edges:
                    edges.add(pair)
                else:
                    leftover[a] += 1
                    leftover[b] += 1
            if not leftover:
                return edges
            if not any((min(u, v), max(u, v)) not in edges for u, v in combinations(leftover, 2)):
                break  # the remaining stubs can only form loops or repeated edges: start over
            stubs = np.array([node for node, count in leftover.items() for _ in range(count)])
    raise RuntimeError(f"Could not draw a {degree}-regular graph on {num_clients} clients in {max_restarts} attempts.")


# --- checks and spectra ---------------------------------------------------------------------------
def validate_mixing_matrix(weights: np.ndarray, kind: str = ROW_STOCHASTIC, name: str = "mixing matrix") -> np.ndarray:
    """Check ``weights`` and return it as a float64 array.

    Args:
        weights: an ``N x N`` matrix.
        kind: what the topology claims: ``row_stochastic`` (non-negative, rows sum to 1),
            ``doubly_stochastic`` (columns too) or ``symmetric`` (and ``W = W^T``).
        name: how errors name the matrix.

    Raises:
        ValueError: naming the first violated property and the offending row/column/entry.
    """
    if kind not in MATRIX_KINDS:
        raise ValueError(f"kind must be one of {MATRIX_KINDS}, got {kind!r}.")
    matrix = np.asarray(weights, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1] or matrix.shape[0] == 0:
        raise ValueError(f"{name}: must be a non-empty square N x N matrix, got shape {matrix.shape}.")
    if not np.isfinite(matrix).all():
        raise ValueError(f"{name}: has non-finite entries; every weight must be a finite number.")
    if (matrix < -_TOL).any():
        i, j = np.argwhere(matrix < -_TOL)[0]
        raise ValueError(f"{name}: W[{i}, {j}] = {matrix[i, j]:.6g} is negative; mixing weights must be >= 0.")
    rows = matrix.sum(axis=1)
    if not np.allclose(rows, 1.0, rtol=0, atol=_TOL):
        i = int(np.argmax(np.abs(rows - 1.0)))
        raise ValueError(f"{name}: row {i} sums to {rows[i]:.6g}, not 1; every client's mixing weights must sum to 1 "
                         "(normalise the rows).")
    if kind in (SYMMETRIC, DOUBLY_STOCHASTIC):
        columns = matrix.sum(axis=0)
        if not np.allclose(columns, 1.0, rtol=0, atol=_TOL):
            j = int(np.argmax(np.abs(columns - 1.0)))
            raise ValueError(f"{name}: column {j} sums to {columns[j]:.6g}, not 1, but the topology claims a doubly "
                             "stochastic matrix (gossip would not keep the average model).")
    if kind == SYMMETRIC and not np.allclose(matrix, matrix.T, rtol=0, atol=_TOL):
        i, j = np.unravel_index(int(np.argmax(np.abs(matrix - matrix.T))), matrix.shape)
        raise ValueError(f"{name}: W[{i}, {j}] = {matrix[i, j]:.6g} but W[{j}, {i}] = {matrix[j, i]:.6g}; the topology "
                         "claims a symmetric matrix.")
    return matrix


def spectral_gap(weights: np.ndarray, symmetric: bool | None = None) -> float:
    """``1 - |lambda|_2``: one minus the second-largest eigenvalue modulus of ``W`` (1 for a single client).

    For a symmetric ``W`` this is ``1 - max(|lambda_2|, |lambda_N|)`` (eigenvalues from ``eigvalsh``).
    For a non-symmetric ``W`` it is the same quantity from the general eigenvalues: the asymptotic
    per-step contraction of the distance to consensus. For a normal doubly stochastic ``W`` (the
    circulant exponential graph) it also bounds every single step; for a row-stochastic ``W``
    (random_k_out) a single step may contract less. 0 means no consensus (a disconnected or periodic graph).
    """
    matrix = np.asarray(weights, dtype=np.float64)
    if matrix.shape[0] == 1:
        return 1.0
    if symmetric is None:
        symmetric = np.allclose(matrix, matrix.T, rtol=0, atol=_TOL)
    eigenvalues = np.linalg.eigvalsh(matrix) if symmetric else np.linalg.eigvals(matrix)
    moduli = np.sort(np.abs(eigenvalues))[::-1]
    return float(max(0.0, 1.0 - moduli[1]))


# --- the per-round provider -----------------------------------------------------------------------
@dataclass(frozen=True)
class MixingMatrix:
    """One round's mixing matrix, checked on creation.

    Attributes:
        weights: ``W`` as an ``N x N`` float64 array; row ``i`` are client ``i``'s weights.
        topology: the topology's name.
        kind: ``symmetric``, ``doubly_stochastic`` or ``row_stochastic`` (what was validated).
    """

    weights: np.ndarray = field(repr=False)
    topology: str
    kind: str

    def __post_init__(self):
        checked = validate_mixing_matrix(self.weights, self.kind, f"{self.topology} mixing matrix")
        object.__setattr__(self, "weights", checked)

    @property
    def num_clients(self) -> int:
        return self.weights.shape[0]

    @cached_property
    def spectral_gap(self) -> float:
        return spectral_gap(self.weights, symmetric=self.kind == SYMMETRIC)

    def neighbours(self, client_id: int) -> list[int]:
        """Clients whose models client ``client_id`` receives (itself excluded)."""
        return [int(j) for j in np.flatnonzero(self.weights[client_id]) if j != client_id]

    def power(self, steps: int) -> np.ndarray:
        """``W^steps``: the weights of ``steps`` gossip steps applied at once."""
        return np.linalg.matrix_power(self.weights, steps)


#: name -> (builder(num_clients, degree, rng, edges) -> W, kind, whether a seed changes it)
TopologyBuilder = Callable[[int, int, np.random.Generator, list], np.ndarray]
TOPOLOGIES: dict[str, tuple[TopologyBuilder, str, bool]] = {
    "ring": (lambda n, k, rng, edges: ring(n), SYMMETRIC, False),
    "full": (lambda n, k, rng, edges: fully_connected(n), SYMMETRIC, False),
    "exponential": (lambda n, k, rng, edges: exponential(n), DOUBLY_STOCHASTIC, False),
    "random_regular": (lambda n, k, rng, edges: random_regular(n, k, rng), SYMMETRIC, True),
    "random_k_out": (lambda n, k, rng, edges: random_k_out(n, k, rng), ROW_STOCHASTIC, True),
    "graph": (lambda n, k, rng, edges: metropolis_hastings(n, edges), SYMMETRIC, False),
}


class Topology:
    """The communication graph of a run: hands out each round's :class:`MixingMatrix`.

    Args:
        name: a key of :data:`TOPOLOGIES`.
        num_clients: N.
        degree: neighbours per client for ``random_regular`` / ``random_k_out``; larger than N-1 is
            lowered to N-1 (every other client) with a log message.
        redraw: draw a new random graph every round (seeded by ``(seed, round)``); otherwise one graph.
            Ignored by the deterministic topologies.
        edges: undirected edges for ``graph``.
        seed: the run's seed.

    Matrices are built lazily (only the process that gossips needs them) and cached when fixed.
    """

    def __init__(self, name: str, num_clients: int, *, degree: int = 10, redraw: bool = False,
                 edges: Iterable[tuple[int, int]] | None = None, seed: int = 0):
        if name not in TOPOLOGIES:
            raise ValueError(f"topology: {name!r} is not a known topology. Available: {', '.join(sorted(TOPOLOGIES))}.")
        _check_num_clients(num_clients)
        if name == "graph" and edges is None:
            raise ValueError("topology_edges: topology='graph' needs its undirected edges [[i, j], ...].")
        self.name = name
        self.num_clients = num_clients
        self.kind = TOPOLOGIES[name][1]
        self.random = TOPOLOGIES[name][2]
        if self.random and degree > num_clients - 1:
            logger.info("topology_degree=%d > num_clients-1=%d: every client neighbours all others.",
                        degree, num_clients - 1)
            degree = num_clients - 1
        if name == "random_regular":
            check_regular_degree(num_clients, degree)  # now, not mid-run on the process that gossips
        self.degree = degree
        self.redraw = redraw and self.random
        self.edges = sorted(_undirected_edges(num_clients, edges)) if edges is not None else None
        self.seed = seed
        self._fixed: MixingMatrix | None = None

    @classmethod
    def from_args(cls, args) -> "Topology":
        edges = load_edges(args.topology_edges) if args.topology == "graph" else None
        return cls(args.topology, args.num_clients, degree=args.topology_degree, redraw=args.topology_redraw,
                   edges=edges, seed=args.seed)

    def matrix(self, round_index: int = 0) -> MixingMatrix:
        """The mixing matrix of round ``round_index`` (the same every round unless ``redraw``)."""
        if not self.redraw and self._fixed is not None:
            return self._fixed
        rng = np.random.default_rng(derive_seed(self.seed, _TOPOLOGY_STREAM, round_index if self.redraw else 0))
        builder = TOPOLOGIES[self.name][0]
        matrix = MixingMatrix(builder(self.num_clients, self.degree, rng, self.edges), self.name, self.kind)
        if not self.redraw:
            self._fixed = matrix
        return matrix

    def describe(self) -> dict:
        return {"topology": self.name, "num_clients": self.num_clients, "kind": self.kind,
                "degree": self.degree if self.random else None, "redraw": self.redraw}


def load_edges(path: str | os.PathLike) -> list[tuple[int, int]]:
    """Undirected edges from a JSON file: ``[[i, j], ...]`` or ``{"edges": [[i, j], ...]}``."""
    try:
        with open(path) as handle:
            data = json.load(handle)
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(
            f"topology_edges: cannot read {path} as JSON ({error}); give a file holding [[i, j], ...]."
        ) from None
    if isinstance(data, dict):
        data = data.get("edges")
    if not isinstance(data, list) or not all(
        isinstance(e, (list, tuple)) and len(e) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in e)
        for e in data
    ):
        raise ValueError(
            f"topology_edges: {path} must hold a list of integer pairs [[i, j], ...] (or {{\"edges\": ...}})."
        )
    return [(int(i), int(j)) for i, j in data]


def _undirected_edges(num_clients: int, edges: Iterable[tuple[int, int]]) -> set[tuple[int, int]]:
    pairs = set()
    for edge in edges:
        i, j = (int(v) for v in edge)
        if not (0 <= i < num_clients and 0 <= j < num_clients):
            raise ValueError(f"topology_edges: edge [{i}, {j}] names a client outside 0..{num_clients - 1} "
                             f"(num_clients={num_clients}).")
        if i == j:
            raise ValueError(f"topology_edges: edge [{i}, {j}] is a self-loop; every client always keeps a share of "
                             "its own model, so list only edges between different clients.")
        pairs.add((min(i, j), max(i, j)))
    return pairs


def _connected(num_clients: int, edges: set[tuple[int, int]]) -> bool:
    neighbours: dict[int, list[int]] = defaultdict(list)
    for i, j in edges:
        neighbours[i].append(j)
        neighbours[j].append(i)
    seen, frontier = {0}, [0]
    while frontier:
        node = frontier.pop()
        for other in neighbours[node]:
            if other not in seen:
                seen.add(other)
                frontier.append(other)
    return len(seen) == num_clients


def _check_num_clients(num_clients: int) -> None:
    if not isinstance(num_clients, (int, np.integer)) or num_clients < 1:
        raise ValueError(f"num_clients must be an integer >= 1, got {num_clients!r}.")
