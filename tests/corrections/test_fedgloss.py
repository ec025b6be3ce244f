"""FedGloSS's client half (``fedgloss``): the step ``d = grad F(w + rho_l g/||g||) - sigma_k + (w - w~)/beta`` from
the weights ``w~`` the client received, the dual ``sigma_k <- sigma_k - (w_k - w~)/beta`` after the round, and the
client radius ramp ``rho_l(t) = rho_0 + (rho_l - rho_0) t / T_s``, computed by hand. (The server rule:
``tests/aggregators/test_fedgloss.py``.)"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hf_fedflat.algorithms import LocalResult

from step_helpers import context, descend, grad_at, run_client, setup, unit, vector


def sam_gradient(model, trainer, w, x, y, rho):
    g = grad_at(model, trainer, w, x, y)
    return grad_at(model, trainer, w + rho * unit(g), x, y)


def test_step_and_dual_equal_the_formulas(tmp_path, tiny_model, tiny_data):
    rho, beta, steps = 0.3, 2.0, 3
    args, trainer, algorithm, x, y, w_sent = setup(tmp_path, tiny_model, tiny_data, fed_algorithm="fedgloss", rho=rho,
                                                   rho_warmup_rounds=0, fedgloss_beta=beta)
    sigma = vector(trainer.space.numel, 5)
    expected = descend(w_sent, steps, lambda w: sam_gradient(tiny_model, trainer, w, x, y, rho) - sigma
                       + (w - w_sent) / beta)
    ctx = context(trainer, state={"fedgloss": {"sigma": sigma}})
    workspaces = run_client(trainer, algorithm, tiny_data, ctx, steps=steps)
    w_k = trainer.space.flatten()
    torch.testing.assert_close(w_k, expected, rtol=0, atol=1e-6)

    state, messages = algorithm.end_client(ctx, workspaces, LocalResult(w_k, steps, w_k - w_sent))
    torch.testing.assert_close(state["fedgloss"]["sigma"], sigma - (w_k - w_sent) / beta, rtol=0, atol=1e-7)
    assert messages == {}  # the server's dual follows from the deltas


def test_first_participation_has_a_zero_dual(tmp_path, tiny_model, tiny_data):
    beta = 4.0
    args, trainer, algorithm, x, y, w_sent = setup(tmp_path, tiny_model, tiny_data, fed_algorithm="fedgloss", rho=0.0,
                                                   rho_warmup_rounds=0, fedgloss_beta=beta)
    expected = descend(w_sent, 2, lambda w: grad_at(tiny_model, trainer, w, x, y) + (w - w_sent) / beta)
    ctx = context(trainer)
    workspaces = run_client(trainer, algorithm, tiny_data, ctx, steps=2)
    w_k = trainer.space.flatten()
    torch.testing.assert_close(w_k, expected, rtol=0, atol=1e-6)
    state, _ = algorithm.end_client(ctx, workspaces, LocalResult(w_k, 2, w_k - w_sent))
    torch.testing.assert_close(state["fedgloss"]["sigma"], -(w_k - w_sent) / beta, rtol=0, atol=1e-7)


def test_client_radius_ramps_over_the_warmup_rounds(tmp_path, tiny_model, tiny_data):
    """Round 3 of a 10-round ramp from 0.01 to 0.5: rho = 0.01 + 0.49 * 3/10 = 0.157; from round 10 on: 0.5."""
    args, trainer, algorithm, x, y, w0 = setup(tmp_path, tiny_model, tiny_data, fed_algorithm="fedgloss", rho=0.5,
                                               rho_start=0.01, rho_warmup_rounds=10, fedgloss_beta=1e9)
    for round_index, rho in ((3, 0.157), (10, 0.5), (25, 0.5)):
        trainer.space.load_(w0)
        ctx = dataclasses.replace(context(trainer), round=round_index)
        assert algorithm.perturbation.begin(ctx) == pytest.approx(rho, rel=1e-12)
        # beta 1e9: the dual terms vanish, the step is SAM's at the round's radius
        expected = descend(w0, 1, lambda w: sam_gradient(tiny_model, trainer, w, x, y, rho))
        run_client(trainer, algorithm, tiny_data, ctx, steps=1)
        torch.testing.assert_close(trainer.space.flatten(), expected, rtol=0, atol=1e-6)
