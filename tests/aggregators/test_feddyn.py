"""FedDyn's server rule (``feddyn``): ``w^{t+1} = mean_i w_i + H / N`` with ``H = sum_i h_i``, its server learning
rate, and ``H`` kept equal to the clients' ``h`` with FedGH in front, computed by hand. (The client term:
``tests/corrections/test_feddyn.py``.)"""

from __future__ import annotations

import pytest
import torch

from hf_fedflat import FedTrainingArguments, build_algorithm
from hf_fedflat.algorithms import ClientUpdate

from step_helpers import P, server, small_run, three_updates


def test_feddyn_server_rule_over_two_rounds(tmp_path):
    algorithm = server(tmp_path, fed_algorithm="feddyn")
    w = torch.linspace(0, 1, 6)
    state = algorithm.init_server_state(w)
    h = {i: torch.zeros(6) for i in range(5)}  # h_i of every client, by hand
    for r in range(2):
        updates = three_updates()
        for u in updates:
            h[u.client_id] = h[u.client_id] + u.delta
        expected = sum(float(p) * (w + u.delta) for p, u in zip(P, updates)) + sum(h.values()) / 5
        w, state = algorithm.server_step(r, w, updates, P, state, num_clients=5)
        torch.testing.assert_close(w, expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("eta_g", [1.0, 0.5])
def test_feddyn_server_learning_rate(tmp_path, eta_g):
    alpha, n = 0.1, 5
    algorithm = build_algorithm(FedTrainingArguments(output_dir=str(tmp_path), use_cpu=True, fed_algorithm="feddyn",
                                                     num_clients=n, clients_per_round=2, feddyn_alpha=alpha,
                                                     server_learning_rate=eta_g))
    w = torch.linspace(-1, 1, 6, dtype=torch.float64)
    h_sum = torch.linspace(0.2, -0.1, 6, dtype=torch.float64)
    deltas = [torch.randn(6, generator=torch.Generator().manual_seed(s), dtype=torch.float64) for s in (1, 2)]
    p = torch.tensor([0.25, 0.75], dtype=torch.float64)
    updates = [ClientUpdate(i, 1, 1, 0.0, d) for i, d in enumerate(deltas)]
    new_w, state = algorithm.server_step(0, w, updates, p, {"aggregator": {"h_sum": h_sum.clone()}}, num_clients=n)
    new_h = h_sum + deltas[0] + deltas[1]
    expected = w + eta_g * (0.25 * deltas[0] + 0.75 * deltas[1] + new_h / n)
    torch.testing.assert_close(new_w, expected, rtol=0, atol=1e-15)
    torch.testing.assert_close(state["aggregator"]["h_sum"], new_h, rtol=0, atol=1e-15)


def test_feddyn_with_fedgh_keeps_h_sum_equal_to_the_clients_h(tmp_path):
    trainer, _ = small_run(tmp_path, fed_algorithm="feddyn+fedgh", num_clients=6, clients_per_round=3, num_rounds=3,
                           local_steps=3, dirichlet_alpha=0.5, seed=7, eval_every_n_rounds=3)
    h_sum = trainer.strategy.server_state()["aggregator"]["h_sum"]
    clients_h = sum(trainer.store.get(c).get("feddyn", {}).get("h", torch.zeros_like(h_sum)) for c in range(6))
    assert float((h_sum - clients_h).norm()) < 1e-5  # was 0.49 on this set-up before the fix
    assert float(h_sum.norm()) > 0.1
