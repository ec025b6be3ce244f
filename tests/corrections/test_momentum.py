"""Client momentum (``momentum``: MoFedSAM, FedCM): ``d = a g + (1 - a) m`` with ``m`` the last global update,
the server's ``m`` and the first round, computed by hand from the papers' formulas (docs/algorithms.md)."""

from __future__ import annotations

import torch

from hf_fedflat import build_algorithm
from hf_fedflat.algorithms import ClientUpdate

from conftest import tiny_loss
from step_helpers import (
    EPS, LR, context, descend, flat, grad_at, grad_of, make_trainer, run_client, setup, update, vector,
)


def test_momentum_mixes_the_last_global_update(tmp_path, tiny_model, tiny_data):
    a = 0.3
    args, trainer, algorithm, x, y, w0 = setup(tmp_path, tiny_model, tiny_data, perturbation="none",
                                               corrections="momentum", momentum_alpha=a)
    dim = w0.numel()
    # server half: m = -(sum p_i Delta_i) / (K * eta) with K the weighted mean of local steps
    d1, d2 = vector(dim, 8), vector(dim, 9)
    updates = [ClientUpdate(0, 8, 2, 0.0, d1), ClientUpdate(1, 8, 4, 0.0, d2)]
    p = torch.tensor([0.25, 0.75], dtype=torch.float64)
    state = algorithm.init_server_state(w0)
    _, state = algorithm.server_step(0, w0, updates, p, state, num_clients=2, learning_rate=0.2)
    m = -(0.25 * d1 + 0.75 * d2) / ((0.25 * 2 + 0.75 * 4) * 0.2)
    torch.testing.assert_close(state["momentum"]["m"], m, rtol=0, atol=1e-7)
    expected = descend(w0, 2, lambda w: a * grad_at(tiny_model, trainer, w, x, y) + (1 - a) * m)
    run_client(trainer, algorithm, tiny_data, context(trainer, broadcast=algorithm.broadcast(state)), steps=2)
    torch.testing.assert_close(trainer.space.flatten(), expected, rtol=0, atol=1e-6)


def test_momentum_round_zero_leaves_the_gradient(tmp_path, tiny_model, tiny_data):
    # (the mofedsam preset's own default is the paper's zero momentum: the test below)
    args, trainer, algorithm, x, y, w0 = setup(tmp_path, tiny_model, tiny_data, fed_algorithm="mofedsam", rho=0.0,
                                               momentum_first_round="unchanged")
    broadcast = algorithm.broadcast(algorithm.init_server_state(w0))
    expected = descend(w0, 2, lambda w: grad_at(tiny_model, trainer, w, x, y))  # rho=0: SAM is the gradient
    run_client(trainer, algorithm, tiny_data, context(trainer, broadcast=broadcast), steps=2)
    torch.testing.assert_close(trainer.space.flatten(), expected, rtol=0, atol=1e-6)


def test_mofedsam_first_round_is_zero_momentum(tmp_path, tiny_model, tiny_data):
    """Round 0, no global update yet: the paper's Delta^0 = 0 gives d = a * g_sam (rho=0: a * g)."""
    a = 0.4
    args, trainer = make_trainer(tmp_path, tiny_model, fed_algorithm="mofedsam", rho=0.0, momentum_alpha=a)
    assert args.momentum_first_round == "zero_momentum"
    algorithm = build_algorithm(args)
    x, y = tiny_data[:]["x"], tiny_data[:]["labels"]
    w = trainer.space.flatten()
    expected = w.clone()
    for _ in range(2):
        params = [t.detach().clone().requires_grad_(True) for t in trainer.space.split(expected)]
        g = flat(torch.autograd.grad(tiny_loss(tiny_model, params, x, y), params))
        expected = expected - LR * a * g
    broadcast = algorithm.broadcast(algorithm.init_server_state(w))
    run_client(trainer, algorithm, tiny_data, context(trainer, broadcast=broadcast), steps=2)
    torch.testing.assert_close(trainer.space.flatten(), expected, rtol=0, atol=1e-6)


# --- FedCM ------------------------------------------------------------------------------------------------
def test_fedcm_mixes_the_broadcast_global_update(tmp_path, tiny_model, tiny_data):
    args, trainer, algorithm, x, y, w0 = setup(tmp_path, tiny_model, tiny_data, fed_algorithm="fedcm")
    assert args.momentum_alpha == 0.1 and args.momentum_first_round == "zero_momentum"
    assert args.aggregation_weights == "uniform"
    a = 0.1
    m = vector(w0.numel(), 1)  # Delta^{t-1} = -(global change) / (K eta)
    g = lambda w: grad_of(lambda p: tiny_loss(tiny_model, p, x, y), trainer, w)  # noqa: E731
    expected = descend(w0, 2, lambda w: a * g(w) + (1 - a) * m)
    run_client(trainer, algorithm, tiny_data, context(trainer, broadcast={"momentum": {"m": m,
                                                                                       "ready": torch.ones(1)}}), 2)
    torch.testing.assert_close(trainer.space.flatten(), expected, rtol=0, atol=1e-6)

    # server: Delta^t = -(sum_i Delta_i / |S|) / (K eta), uniform over the two clients
    d1, d2 = vector(w0.numel(), 2), vector(w0.numel(), 3)
    state = algorithm.init_server_state(w0)
    _, state = algorithm.server_step(0, w0, [update(0, d1, steps=3), update(1, d2, steps=3)],
                                     torch.tensor([0.5, 0.5]), state, 2, learning_rate=LR)
    torch.testing.assert_close(state["momentum"]["m"], -(d1 + d2) / 2 / (3 * LR), rtol=0, atol=1e-7)


def test_fedcm_first_round_has_no_momentum(tmp_path, tiny_model, tiny_data):
    args, trainer, algorithm, x, y, w0 = setup(tmp_path, tiny_model, tiny_data, fed_algorithm="fedcm")
    g = lambda w: grad_of(lambda p: tiny_loss(tiny_model, p, x, y), trainer, w)  # noqa: E731
    expected = descend(w0, 2, lambda w: 0.1 * g(w))  # Delta^0 = 0
    broadcast = algorithm.broadcast(algorithm.init_server_state(w0))
    run_client(trainer, algorithm, tiny_data, context(trainer, broadcast=broadcast), 2)
    torch.testing.assert_close(trainer.space.flatten(), expected, rtol=0, atol=1e-6)


def test_fedcm_with_lesam_mixes_the_momentum_into_the_lesam_gradient(tmp_path, tiny_model, tiny_data):
    a, rho = 0.1, 0.3
    args, trainer, algorithm, x, y, w0 = setup(tmp_path, tiny_model, tiny_data, fed_algorithm="fedcm",
                                               perturbation="lesam", rho=rho)
    dim = w0.numel()
    m, w_old = vector(dim, 1), w0 + vector(dim, 2)
    e = rho * (w_old - w0) / ((w_old - w0).norm() + EPS)
    g = lambda w: grad_of(lambda p: tiny_loss(tiny_model, p, x, y), trainer, w)  # noqa: E731
    ctx = context(trainer, broadcast={"momentum": {"m": m, "ready": torch.ones(1)}}, state={"lesam": {"w_old": w_old}})
    run_client(trainer, algorithm, tiny_data, ctx, 2)
    torch.testing.assert_close(trainer.space.flatten(), descend(w0, 2, lambda w: a * g(w + e) + (1 - a) * m),
                               rtol=0, atol=1e-6)
