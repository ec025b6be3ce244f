"""FedWMSAM (``wmsam``): the momentum-guided perturbation and the mixed direction of the local steps, the client's
``c_k``, and the server's ``c``, ``alpha`` and ``m`` over several rounds with partial participation, computed by hand
(docs/algorithms.md)."""

from __future__ import annotations

import torch

from hf_fedflat.algorithms import ClientUpdate, LocalResult

from step_helpers import EPS, LR, context, grad_at, run_client, server, setup, unit, vector


def test_wmsam_local_steps_and_control_variate(tmp_path, tiny_model, tiny_data):
    rho, alpha = 0.2, 0.3
    args, trainer, algorithm, x, y, w0 = setup(tmp_path, tiny_model, tiny_data, fed_algorithm="fedwmsam", rho=rho,
                                               weight_decay=0.0)
    dim = w0.numel()
    m, c, c_i = vector(dim, 3, 0.5), vector(dim, 4), vector(dim, 5)
    m_k = m + alpha / (1 - alpha) * (c - c_i)
    w, target = w0.clone(), w0.clone()
    for b in range(3):
        delta = target - w  # (x_r + b m_k) - x_b
        e = rho * delta / (delta.norm() + EPS)
        v = alpha * grad_at(tiny_model, trainer, w + e, x, y) + (1 - alpha) * m_k
        assert v.norm() < args.max_grad_norm  # (so clipping does not enter)
        w, target = w - LR * v, target + m_k
    ctx = context(trainer, broadcast={"wmsam": {"m": m, "c": c, "alpha": torch.tensor([alpha])}},
                  state={"wmsam": {"c_i": c_i}})
    workspaces = run_client(trainer, algorithm, tiny_data, ctx, steps=3)
    w_local = trainer.space.flatten()
    torch.testing.assert_close(w_local, w, rtol=0, atol=1e-6)
    assert trainer.gradient_passes == 3
    # the perturbation goes along delta (the README), not against it (the code): the two differ here
    along = grad_at(tiny_model, trainer, w0 + rho * unit(m_k), x, y)
    against = grad_at(tiny_model, trainer, w0 - rho * unit(m_k), x, y)
    assert (along - against).abs().max() > 1e-3
    state, messages = algorithm.end_client(ctx, workspaces, LocalResult(w_local, 3, w_local - w0))
    torch.testing.assert_close(state["wmsam"]["c_i"], c_i - c + (w0 - w_local) / (3 * LR), rtol=0, atol=1e-5)
    assert messages.get("wmsam", {}) == {}


N = 5
#: the clients sampled in each round and their local steps (partial participation, unequal steps)
ROUNDS = [((0, 2, 4), (2, 3, 2)), ((1, 2), (4, 2)), ((0, 3, 4), (2, 2, 5))]


def test_wmsam_server_half_over_rounds(tmp_path):
    algorithm = server(tmp_path, fed_algorithm="fedwmsam")  # N = 5 clients
    w = torch.linspace(-1, 1, 6)
    state = algorithm.init_server_state(w)
    m, c, alpha = torch.zeros(6), torch.zeros(6), 0.1  # by hand
    for r, (clients, steps) in enumerate(ROUNDS):
        deltas = [vector(6, 10 * r + k, 0.5) for k in clients]
        if r == 2:  # an update that agrees with the momentum (a step down the gradient m): cos = -1
            deltas[0] = -3.0 * m
        updates = [ClientUpdate(k, 8, s, 0.0, d) for k, s, d in zip(clients, steps, deltas)]
        p = torch.tensor([1.0 / len(clients)] * len(clients), dtype=torch.float64)
        values = [float(d @ m / (d.norm() * m.norm())) + 1 if m.norm() > 0 else 0.0 for d in deltas]
        alpha = 0.99 * alpha + 0.01 * min(max(sum(values) / len(values), 0.1), 0.9)
        c = c + sum((-c - d / (s * LR)) for d, s in zip(deltas, steps)) / N
        m = -sum(float(pi) * d for pi, d in zip(p, deltas)) / (sum(float(pi) * s for pi, s in zip(p, steps)) * LR)
        expected_w = w + sum(float(pi) * d for pi, d in zip(p, deltas))
        w, state = algorithm.server_step(r, w, updates, p, state, num_clients=N, learning_rate=LR)
        torch.testing.assert_close(w, expected_w, rtol=0, atol=1e-6)
        torch.testing.assert_close(state["wmsam"]["c"], c, rtol=0, atol=1e-5)
        torch.testing.assert_close(state["wmsam"]["m"], m, rtol=0, atol=1e-5)
        assert abs(float(state["wmsam"]["alpha"]) - alpha) < 1e-6
    assert alpha != 0.1  # the weight moved


def test_the_preset(tmp_path, tiny_model, tiny_data):
    args, _, algorithm, *_ = setup(tmp_path, tiny_model, tiny_data, fed_algorithm="fedwmsam")
    config = algorithm.perturbation.config
    assert (config.rho, config.wmsam_alpha, args.max_grad_norm, algorithm.aggregator.name) == (0.1, 0.1, 10.0, "mean")
    assert args.aggregation_weights == "uniform"  # a plain mean over the sampled clients, as the paper and its code


def test_alpha_is_kept_in_the_runs_precision(tmp_path):
    """In a float64 run alpha is a float64 tensor, and its update is the formula in float64 (not rounded to float32)."""
    algorithm = server(tmp_path, fed_algorithm="fedwmsam")
    w = torch.linspace(-1, 1, 6, dtype=torch.float64)
    state = algorithm.init_server_state(w)
    assert state["wmsam"]["alpha"].dtype == torch.float64
    deltas = [vector(6, 1, 0.5).double(), vector(6, 2, 0.5).double()]
    updates = [ClientUpdate(k, 8, 2, 0.0, d) for k, d in enumerate(deltas)]
    p = torch.tensor([0.5, 0.5], dtype=torch.float64)
    for r in range(2):  # round 0: m = 0 (cosines 0); round 1: against the momentum of round 0
        m = state["wmsam"]["m"]
        alpha = float(state["wmsam"]["alpha"])
        values = [float(d @ m / (d.norm() * m.norm())) + 1 if m.norm() > 0 else 0.0 for d in deltas]
        expected = 0.99 * alpha + 0.01 * min(max(sum(values) / 2, 0.1), 0.9)
        w, state = algorithm.server_step(r, w, updates, p, state, num_clients=2, learning_rate=LR)
        assert state["wmsam"]["alpha"].dtype == torch.float64
        assert abs(float(state["wmsam"]["alpha"]) - expected) < 1e-14  # float32 would be ~1e-9 off (0.1 itself)
