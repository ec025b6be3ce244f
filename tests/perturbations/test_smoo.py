"""SMOO (``smoo``, FedSMOO's perturbation): the corrected ascent direction, the client's ``mu`` and the server's
``s``, computed by hand from the paper's formula (docs/algorithms.md)."""

from __future__ import annotations

import torch

from hf_fedflat.algorithms import ClientUpdate, LocalResult

from step_helpers import context, descend, grad_at, run_client, setup, unit, vector


def test_smoo_corrected_perturbation_state_and_server(tmp_path, tiny_model, tiny_data):
    rho = 0.3
    args, trainer, algorithm, x, y, w0 = setup(tmp_path, tiny_model, tiny_data, perturbation="smoo", corrections="",
                                               aggregator="mean", rho=rho)
    dim = w0.numel()
    s, mu0 = vector(dim, 3), vector(dim, 4)
    mu = mu0.clone()

    def direction(w):
        nonlocal mu
        g_hat = grad_at(tiny_model, trainer, w, x, y) - mu - s
        e = rho * unit(g_hat)
        mu = mu + e - s
        return grad_at(tiny_model, trainer, w + e, x, y)

    expected = descend(w0, 2, direction)
    ctx = context(trainer, broadcast={"smoo": {"s": s}}, state={"smoo": {"mu": mu0}})
    workspaces = run_client(trainer, algorithm, tiny_data, ctx, steps=2)
    torch.testing.assert_close(trainer.space.flatten(), expected, rtol=0, atol=1e-6)
    w_local = trainer.space.flatten()
    state, messages = algorithm.end_client(ctx, workspaces, LocalResult(w_local, 2, w_local - ctx.global_params))
    torch.testing.assert_close(state["smoo"]["mu"], mu, rtol=0, atol=1e-6)
    # server: s = rho * mean(mu_i) / ||mean(mu_i)||
    other_mu = vector(dim, 5)
    updates = [ClientUpdate(0, 8, 2, 0.0, torch.zeros(dim), messages=messages),
               ClientUpdate(1, 8, 2, 0.0, torch.zeros(dim), messages={"smoo": {"mu": other_mu}})]
    _, server = algorithm.server_step(0, w0, updates, torch.tensor([0.5, 0.5], dtype=torch.float64),
                                      {"smoo": {"s": s}}, num_clients=4)
    mean_mu = (mu + other_mu) / 2
    torch.testing.assert_close(server["smoo"]["s"], rho * mean_mu / mean_mu.norm(), rtol=0, atol=1e-6)
