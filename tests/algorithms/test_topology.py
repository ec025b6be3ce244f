"""Mixing matrices (``algorithms.topology``) against hand-computed ones, their spectral gaps and validation.
(Gossip over them and its consensus rate: ``tests/aggregators/test_gossip.py``.)"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from hf_fedflat.decentralized import (
    MixingMatrix,
    Topology,
    exponential,
    fully_connected,
    metropolis_hastings,
    random_k_out,
    random_regular,
    ring,
    spectral_gap,
    validate_mixing_matrix,
)

T = 1 / 3


def test_ring_full_and_exponential_equal_hand_computed():
    np.testing.assert_allclose(ring(4), [[T, T, 0, T], [T, T, T, 0], [0, T, T, T], [T, 0, T, T]], rtol=0, atol=1e-15)
    np.testing.assert_allclose(ring(1), [[1.0]])
    np.testing.assert_allclose(ring(2), [[0.5, 0.5], [0.5, 0.5]])  # the two neighbours coincide: one edge
    np.testing.assert_allclose(ring(3), np.full((3, 3), T))
    np.testing.assert_allclose(fully_connected(3), np.full((3, 3), T))
    # N=8: client i averages i, i+1, i+2, i+4 (mod 8) with weight 1/4
    expected = np.zeros((8, 8))
    for i in range(8):
        for offset in (0, 1, 2, 4):
            expected[i, (i + offset) % 8] = 0.25
    np.testing.assert_array_equal(exponential(8), expected)
    assert exponential(8)[0, 4] == 0.25 and exponential(8)[0, 7] == 0  # directed: 0 listens to 4, not to 7
    validate_mixing_matrix(exponential(8), "doubly_stochastic")
    with pytest.raises(ValueError, match="symmetric"):
        validate_mixing_matrix(exponential(8), "symmetric")
    np.testing.assert_allclose(exponential(2), [[0.5, 0.5], [0.5, 0.5]])


def test_metropolis_hastings_on_a_path_and_a_star():
    # path 0-1-2: degrees 1, 2, 1 -> off-diagonal 1/(1+2) = 1/3
    np.testing.assert_allclose(metropolis_hastings(3, [(0, 1), (2, 1)]),
                               [[2 / 3, 1 / 3, 0], [1 / 3, 1 / 3, 1 / 3], [0, 1 / 3, 2 / 3]], rtol=0, atol=1e-15)
    # star with centre 0 and 3 leaves: degrees 3, 1, 1, 1 -> 1/4 on every edge; repeated edges count once
    np.testing.assert_allclose(metropolis_hastings(4, [(0, 1), (0, 2), (0, 3), (3, 0)]),
                               [[1 / 4, 1 / 4, 1 / 4, 1 / 4], [1 / 4, 3 / 4, 0, 0], [1 / 4, 0, 3 / 4, 0],
                                [1 / 4, 0, 0, 3 / 4]], rtol=0, atol=1e-15)
    with pytest.raises(ValueError, match=r"topology_edges: edge \[1, 5\] names a client outside 0..3"):
        metropolis_hastings(4, [(1, 5)])
    with pytest.raises(ValueError, match="self-loop"):
        metropolis_hastings(4, [(2, 2)])


@pytest.mark.parametrize("n,k", [(10, 3), (12, 4), (8, 5), (7, 6), (2, 1)])
def test_random_regular_is_symmetric_with_k_plus_one_equal_weights_per_row(n, k):
    weights = random_regular(n, k, np.random.default_rng(0))
    validate_mixing_matrix(weights, "symmetric")
    assert ((weights > 0).sum(axis=1) == k + 1).all()
    np.testing.assert_allclose(weights[weights > 0], 1 / (k + 1), rtol=0, atol=1e-15)
    np.testing.assert_allclose(np.diag(weights), 1 / (k + 1), rtol=0, atol=1e-15)
    assert spectral_gap(weights) > 1e-6  # connected
    np.testing.assert_array_equal(weights, random_regular(n, k, np.random.default_rng(0)))  # seeded


def test_random_regular_rejects_impossible_degrees():
    with pytest.raises(ValueError, match="topology_degree: no 3-regular graph on 5 clients"):
        random_regular(5, 3, np.random.default_rng(0))
    with pytest.raises(ValueError, match="topology_degree"):
        random_regular(5, 5, np.random.default_rng(0))
    with pytest.raises(ValueError, match="topology_degree: no 3-regular graph on 7 clients"):
        Topology("random_regular", 7, degree=3)  # when the run is set up, not when the first round gossips


def test_random_k_out_is_row_stochastic_with_self_and_k_others():
    weights = random_k_out(9, 3, np.random.default_rng(1))
    validate_mixing_matrix(weights, "row_stochastic")
    assert ((weights > 0).sum(axis=1) == 4).all() and (np.diag(weights) == 0.25).all()
    assert not np.allclose(weights, weights.T)  # one-sided choices
    assert not np.allclose(weights.sum(axis=0), 1.0)  # not column-stochastic: the average is not kept


def test_spectral_gaps_against_closed_forms():
    # ring of N: eigenvalues (1 + 2 cos(2 pi m / N)) / 3
    for n in (4, 5, 6, 8, 11):
        eig = [(1 + 2 * math.cos(2 * math.pi * m / n)) / 3 for m in range(1, n)]
        assert spectral_gap(ring(n)) == pytest.approx(1 - max(abs(e) for e in eig), abs=1e-12)
    assert spectral_gap(ring(4)) == pytest.approx(2 / 3, abs=1e-12)
    assert spectral_gap(ring(6)) == pytest.approx(1 / 3, abs=1e-12)
    assert spectral_gap(fully_connected(7)) == pytest.approx(1.0, abs=1e-12)
    assert spectral_gap(np.ones((1, 1))) == 1.0
    # exponential N=8 is circulant: eigenvalues (1 + w^m + w^2m + w^4m)/4 with w = exp(2 pi i / 8)
    w = np.exp(2j * np.pi / 8)
    expected = 1 - max(abs(1 + w**m + w ** (2 * m) + w ** (4 * m)) / 4 for m in range(1, 8))
    assert spectral_gap(exponential(8)) == pytest.approx(expected, abs=1e-12)
    # two disconnected edges: no consensus
    assert spectral_gap(metropolis_hastings(4, [(0, 1), (2, 3)])) == pytest.approx(0.0, abs=1e-12)


def test_validation_names_the_broken_property():
    with pytest.raises(ValueError, match="negative"):
        validate_mixing_matrix([[1.5, -0.5], [0.5, 0.5]])
    with pytest.raises(ValueError, match="row 1 sums to 0.9"):
        validate_mixing_matrix([[0.5, 0.5], [0.4, 0.5]])
    with pytest.raises(ValueError, match="column 0 sums"):
        validate_mixing_matrix([[1.0, 0.0], [1.0, 0.0]], "doubly_stochastic")
    with pytest.raises(ValueError, match="square"):
        validate_mixing_matrix(np.ones((2, 3)) / 3)
    with pytest.raises(ValueError, match="symmetric"):
        MixingMatrix(np.array([[0.5, 0.5, 0], [0, 0.5, 0.5], [0.5, 0, 0.5]]), "custom", "symmetric")


def test_topology_draws_fixed_or_per_round_and_reads_edge_files(tmp_path):
    fixed = Topology("random_regular", 10, degree=3, seed=4)
    assert fixed.matrix(0) is fixed.matrix(5)
    redrawn = Topology("random_regular", 10, degree=3, seed=4, redraw=True)
    np.testing.assert_array_equal(redrawn.matrix(3).weights, Topology("random_regular", 10, degree=3, seed=4,
                                                                      redraw=True).matrix(3).weights)
    assert not np.array_equal(redrawn.matrix(1).weights, redrawn.matrix(2).weights)
    # a degree above N-1 means "everyone": the complete graph
    everyone = Topology("random_regular", 5, degree=10).matrix().weights
    np.testing.assert_allclose(everyone, fully_connected(5), atol=1e-15)
    assert Topology("random_k_out", 6, degree=2).matrix().kind == "row_stochastic"

    path = tmp_path / "edges.json"
    path.write_text(json.dumps([[0, 1], [1, 2]]))
    from types import SimpleNamespace

    args = SimpleNamespace(topology="graph", num_clients=3, topology_degree=10, topology_redraw=False,
                           topology_edges=str(path), seed=0)
    np.testing.assert_allclose(Topology.from_args(args).matrix().weights, metropolis_hastings(3, [(0, 1), (1, 2)]))
    path.write_text(json.dumps([[0, "a"]]))
    with pytest.raises(ValueError, match="topology_edges: .* integer pairs"):
        Topology.from_args(args)
    with pytest.raises(ValueError, match="topology: 'star' is not a known topology"):
        Topology("star", 4)
