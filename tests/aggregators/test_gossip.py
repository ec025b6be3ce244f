"""Gossip (``gossip``, the decentralized presets' rule): ``x_i = sum_j W_ij z_j`` row by row (``gossip_rows``),
reaching consensus at the spectral gap's rate, and its configuration's checks. (The mixing matrices:
``tests/algorithms/test_topology.py``; the round loop: ``tests/decentralized/``.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hf_fedflat.decentralized import (
    exponential, fully_connected, gossip_rows, metropolis_hastings, random_regular, ring, spectral_gap,
)


def test_graph_topology_needs_its_edges():
    from hf_fedflat.aggregators.gossip import GossipConfig

    with pytest.raises(ValueError, match="^topology_edges: "):
        GossipConfig(topology="graph").validate()


@pytest.mark.parametrize("weights", [ring(6), ring(9), exponential(8), random_regular(12, 3, np.random.default_rng(2)),
                                     metropolis_hastings(5, [(0, 1), (1, 2), (2, 3), (3, 4), (0, 2)])])
def test_repeated_gossip_reaches_consensus_at_the_spectral_gap_rate(weights):
    """||X W^k - x_bar|| <= (1 - gap)^k ||X - x_bar||, and the per-step ratio tends to 1 - gap."""
    n = weights.shape[0]
    models = [torch.randn(7, generator=torch.Generator().manual_seed(i), dtype=torch.float64) for i in range(n)]
    average = torch.stack(models).mean(dim=0)
    rate = 1 - spectral_gap(weights)

    def distance(xs):
        return torch.stack([x - average for x in xs]).norm().item()

    start, distances = distance(models), []
    for _ in range(40):
        models = [mixed["x"] for _, mixed in gossip_rows(weights, lambda j, xs=models: {"x": xs[j]})]
        distances.append(distance(models))
    # doubly stochastic W keeps the average model
    torch.testing.assert_close(torch.stack(models).mean(dim=0), average, rtol=0, atol=1e-12)
    for k, d in enumerate(distances, start=1):
        assert d <= rate**k * start * (1 + 1e-9) + 1e-13
    assert distances[-1] / distances[-2] == pytest.approx(rate, abs=2e-3)


def test_fully_connected_gossip_is_the_mean_and_loads_each_model_once():
    models = [torch.full((3,), float(i)) for i in range(5)]
    loads = []

    def load(j):
        loads.append(j)
        return {"x": models[j]}

    mixed = [out["x"] for _, out in gossip_rows(fully_connected(5), load)]
    assert loads == [0, 1, 2, 3, 4]  # identical rows reuse the first row's result
    for x in mixed:
        torch.testing.assert_close(x, torch.full((3,), 2.0), rtol=0, atol=1e-6)
