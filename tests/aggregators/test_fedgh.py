"""FedGH (``+fedgh``, the plug-in in front of any aggregator): the pairwise projection of conflicting updates and
the paper's Algorithm 1 (``fedgh_mode sequential``), computed by hand, and the base rule applied to the harmonized
updates."""

from __future__ import annotations

import pytest
import torch

from hf_fedflat import FedTrainingArguments, build_algorithm
from hf_fedflat.aggregators import harmonize
from hf_fedflat.aggregators.fedgh import round_seed, sequential_coefficients
from hf_fedflat.algorithms import ClientUpdate

from step_helpers import LR, P, server, setup, three_updates, update, vector


def explicit_harmonize(vectors):
    """FedGH written out: every conflicting pair (originals) projected, sequentially, with the originals."""
    originals = [v.clone() for v in vectors]
    g = [v.clone() for v in vectors]
    for i in range(len(g)):
        for j in range(i + 1, len(g)):
            if originals[i] @ originals[j] < 0:
                gi, gj = g[i].clone(), g[j].clone()
                g[i] = gi - (gi @ originals[j]) / (originals[j] @ originals[j]) * originals[j]
                g[j] = gj - (gj @ originals[i]) / (originals[i] @ originals[i]) * originals[i]
    return g


def test_fedgh_matches_the_explicit_projection():
    vectors = [torch.tensor(v, dtype=torch.float64) for v in
               ([1.0, 0.2, -0.5, 0.0], [-0.8, 1.0, 0.3, 0.1], [0.5, -1.0, 0.2, 0.7], [-0.3, -0.4, 1.0, -0.9])]
    harmonized, ratio = harmonize(vectors)
    for got, want in zip(harmonized, explicit_harmonize(vectors)):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    conflicts = sum(int(vectors[i] @ vectors[j] < 0) for i in range(4) for j in range(i + 1, 4))
    assert 0 < conflicts and ratio == conflicts / 6


def test_fedgh_leaves_agreeing_updates_and_resolves_a_conflicting_pair():
    agreeing = [torch.tensor([1.0, 0.5, 0.0]), torch.tensor([0.2, 1.0, 0.3])]
    same, ratio = harmonize(agreeing)
    assert ratio == 0.0 and all(torch.equal(a, b) for a, b in zip(same, agreeing))
    conflicting = [torch.tensor([1.0, 0.2, 0.0]), torch.tensor([-1.0, 0.5, 0.4])]
    assert conflicting[0] @ conflicting[1] < 0
    (gi, gj), ratio = harmonize(conflicting)
    assert ratio == 1.0 and gi @ gj >= 0
    assert abs(gi @ conflicting[1]) < 1e-6 and abs(gj @ conflicting[0]) < 1e-6  # each orthogonal to the other


@pytest.mark.parametrize("base, recombined_weights", [("fedadam", True), ("fedavg", True), ("fednova", False)])
def test_fedgh_plugs_in_front_of_any_aggregator(tmp_path, base, recombined_weights):
    """Linear rules (mean, FedAdam) get the original updates with weights C^T p, the others the harmonized
    updates; both equal the base rule applied to the explicitly harmonized updates."""
    updates = three_updates()
    updates[1].delta = -updates[0].delta + 0.1  # force a conflict
    harmonized = explicit_harmonize([u.delta.double() for u in updates])
    w = torch.zeros(6)
    plain = server(tmp_path, fed_algorithm=base)
    with_gh = server(tmp_path, fed_algorithm=f"{base}+fedgh")
    assert with_gh.aggregator.name == f"{plain.aggregator.name}+fedgh"
    assert with_gh.aggregator.base.capabilities.linear_in_weighted_delta == recombined_weights
    expected, _ = plain.server_step(0, w, [ClientUpdate(u.client_id, u.num_samples, u.num_steps, 0.0, d.float())
                                           for u, d in zip(updates, harmonized)], P, plain.init_server_state(w), 5)
    got, _ = with_gh.server_step(0, w, updates, P, with_gh.init_server_state(w), 5)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    unharmonized, _ = plain.server_step(0, w, updates, P, plain.init_server_state(w), 5)
    assert (unharmonized - expected).abs().max() > 1e-3  # harmonizing changed the result: the check has teeth


def test_gram_matrix_in_blocks_equals_the_full_product(monkeypatch):
    from hf_fedflat.aggregators import fedgh

    monkeypatch.setattr(fedgh, "GRAM_BLOCK_COLUMNS", 7)  # 50 columns: 7 full blocks and a short one
    vectors = [torch.randn(50, generator=torch.Generator().manual_seed(i), dtype=torch.float64) for i in range(5)]
    stacked = torch.stack(vectors)
    torch.testing.assert_close(fedgh.gram_matrix(vectors), stacked @ stacked.T, rtol=0, atol=1e-12)
    single = [v.float() for v in vectors]  # float32 blocks, float64 sum
    torch.testing.assert_close(fedgh.gram_matrix(single), stacked @ stacked.T, rtol=0, atol=1e-5)


def algorithm1_by_hand(vectors, order_seed):
    """Per client i, the others in the seeded order; project the RUNNING g_i off the ORIGINAL g~_j on conflict."""
    generator = torch.Generator().manual_seed(order_seed)
    out = []
    m = len(vectors)
    for i in range(m):
        g = vectors[i].clone()
        for j in torch.randperm(m, generator=generator).tolist():
            if j != i and g @ vectors[j] < 0:
                g = g - (g @ vectors[j]) / (vectors[j] @ vectors[j]) * vectors[j]
        out.append(g)
    return out


def test_fedgh_sequential_is_algorithm_1():
    vectors = [torch.tensor(v, dtype=torch.float64) for v in
               ([1.0, 0.0, 0.0], [-1.0, 1.0, 0.0], [-0.2, -1.0, 0.5], [0.3, 0.2, -1.0])]
    seed = round_seed(7, [0, 1, 2, 3])
    coefficients, ratio = sequential_coefficients(vectors, seed)
    got = list(coefficients @ torch.stack(vectors))
    expected = algorithm1_by_hand(vectors, seed)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=0, atol=1e-14)
    conflicting = sum(float(vectors[i] @ vectors[j]) < 0 for i in range(4) for j in range(i + 1, 4))
    assert ratio == conflicting / 6
    # the running-vector test differs from the pairwise form on these vectors
    pairwise, _ = harmonize(vectors)
    assert max(float((p - g).norm()) for p, g in zip(pairwise, got)) > 1e-3


def test_fedgh_mode_option_reaches_the_server_step(tmp_path):
    vectors = [torch.tensor(v, dtype=torch.float64) for v in ([1.0, 0.0, 0.0], [-1.0, 1.0, 0.0], [-0.2, -1.0, 0.5])]
    updates = [ClientUpdate(c, 1, 1, 0.0, v) for c, v in zip((4, 1, 9), vectors)]
    p = torch.full((3,), 1 / 3, dtype=torch.float64)
    w = torch.zeros(3, dtype=torch.float64)
    results = {}
    for mode in ("pairwise", "sequential"):
        algorithm = build_algorithm(FedTrainingArguments(output_dir=str(tmp_path), use_cpu=True, fed_algorithm="fedgh",
                                                         num_clients=10, clients_per_round=3, seed=11, fedgh_mode=mode))
        results[mode], _ = algorithm.server_step(0, w, updates, p, {}, num_clients=10)
    expected_seq = sum(algorithm1_by_hand(vectors, round_seed(11, [4, 1, 9]))) / 3
    expected_pair = sum(harmonize(vectors)[0]) / 3
    torch.testing.assert_close(results["sequential"], expected_seq, rtol=0, atol=1e-14)
    torch.testing.assert_close(results["pairwise"], expected_pair, rtol=0, atol=1e-14)
    assert FedTrainingArguments(output_dir=str(tmp_path), use_cpu=True, fed_algorithm="fedgh").fedgh_mode == "pairwise"


def test_moon_with_fedgh_in_front(tmp_path, tiny_model, tiny_data):
    """moon x mean+fedgh: the harmonized mean of two conflicting updates, projected by hand."""
    args, trainer, algorithm, x, y, w0 = setup(tmp_path, tiny_model, tiny_data, fed_algorithm="moon",
                                               aggregator="mean+fedgh")
    assert algorithm.describe()["corrections"] == ["moon"] and algorithm.aggregator.name == "mean+fedgh"
    d1 = vector(w0.numel(), 4)
    d2 = -d1 + vector(w0.numel(), 5, 0.02)
    assert d1 @ d2 < 0
    g1 = d1 - (d1 @ d2) / (d2 @ d2) * d2
    g2 = d2 - (d2 @ d1) / (d1 @ d1) * d1
    new_w, _ = algorithm.server_step(0, w0, [update(0, d1), update(1, d2)], torch.tensor([0.5, 0.5]),
                                     algorithm.init_server_state(w0), 2, learning_rate=LR)
    torch.testing.assert_close(new_w, w0 + (g1 + g2) / 2, rtol=0, atol=1e-6)
