"""FedSpeed's correction (``fedspeed``): the prox-correction ``-g_hat + (w - w^t)/lambda`` on the merged gradient,
the client's ``g_hat`` and the model it sends (Algorithm 1 lines 5-14 of the FedSpeed paper), computed by hand."""

from __future__ import annotations

import torch

from hf_fedflat.algorithms import LocalResult
from hf_fedflat.algorithms.base import DELTA_SHIFT

from conftest import tiny_loss
from step_helpers import EPS, LR, context, descend, grad_of, run_client, setup, update, vector


def test_fedspeed_merged_gradient_prox_correction_and_sent_model(tmp_path, tiny_model, tiny_data):
    rho, alpha, lam = 0.2, 0.4, 2.0
    args, trainer, algorithm, x, y, w0 = setup(tmp_path, tiny_model, tiny_data, fed_algorithm="fedspeed", rho=rho,
                                               fedspeed_alpha=alpha, fedspeed_lambda=lam)
    assert algorithm.passes_per_step == 2 and args.aggregation_weights == "uniform"
    dim = w0.numel()
    w_global = w0 + vector(dim, 1)
    g_hat = vector(dim, 2)
    g = lambda w: grad_of(lambda p: tiny_loss(tiny_model, p, x, y), trainer, w)  # noqa: E731

    def direction(w):  # Alg. 1 lines 5-9
        g1 = g(w)
        g2 = g(w + rho * g1 / (g1.norm() + EPS))
        return (1 - alpha) * g1 + alpha * g2 - g_hat + (w - w_global) / lam

    expected = descend(w0, 2, direction)
    ctx = context(trainer, state={"fedspeed": {"g_hat": g_hat}})
    ctx.global_params = w_global
    workspaces = run_client(trainer, algorithm, tiny_data, ctx, steps=2)
    w_i = trainer.space.flatten()
    torch.testing.assert_close(w_i, expected, rtol=0, atol=1e-6)
    assert trainer.gradient_passes == 4

    state, messages = algorithm.end_client(ctx, workspaces, LocalResult(w_i, 2, w_i - w_global))
    g_hat_new = g_hat - (w_i - w_global) / lam  # line 11
    torch.testing.assert_close(state["fedspeed"]["g_hat"], g_hat_new, rtol=0, atol=1e-7)
    x_hat = w_i - lam * g_hat_new  # line 12: what the client sends
    torch.testing.assert_close(w_global + (w_i - w_global) + messages["fedspeed"][DELTA_SHIFT], x_hat,
                               rtol=0, atol=1e-6)

    other = w_global + vector(dim, 3)  # a second client's x_hat
    new_w, _ = algorithm.server_step(
        0, w_global, [update(0, w_i - w_global, messages), update(1, other - w_global)],
        torch.tensor([0.5, 0.5]), algorithm.init_server_state(w_global), 2, learning_rate=LR)
    torch.testing.assert_close(new_w, (x_hat + other) / 2, rtol=0, atol=1e-6)  # line 14: mean of x_hat
