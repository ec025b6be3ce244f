"""FedDC (``feddc``): the local drift term ``alpha (w + h_i - w^t)`` beside SCAFFOLD's, the drift ``h_i`` and the
server's mean of ``w_i + h_i``, computed by hand from the paper's formula (docs/algorithms.md)."""

from __future__ import annotations

import torch

from hf_fedflat.algorithms import LocalResult
from hf_fedflat.algorithms.base import DELTA_SHIFT

from conftest import tiny_loss
from step_helpers import EPS, LR, context, descend, flat, grad_of, run_client, setup, update, vector


def test_feddc_local_steps_drift_and_server(tmp_path, tiny_model, tiny_data):
    alpha = 0.3
    args, trainer, algorithm, x, y, w0 = setup(tmp_path, tiny_model, tiny_data, fed_algorithm="feddc",
                                               feddc_alpha=alpha)
    assert args.aggregation_weights == "uniform" and args.scaffold_server_average == "all_clients"  # paper and code
    assert algorithm.describe()["corrections"] == ["feddc", "scaffold"]
    dim = w0.numel()
    w_global = w0 + vector(dim, 1)
    h, c, c_i = vector(dim, 2), vector(dim, 3), vector(dim, 4)

    def objective(p, anchor):  # L_i(w) + alpha/2 ||w + h - w^t||^2 + <w, c - c_i>
        w = flat(p)
        return tiny_loss(tiny_model, p, x, y) + alpha / 2 * (w + h - anchor).pow(2).sum() + w @ (c - c_i)

    expected = descend(w0, 3, lambda w: grad_of(lambda p: objective(p, w_global), trainer, w))
    ctx = context(trainer, broadcast={"scaffold": {"c": c}}, state={"feddc": {"h": h}, "scaffold": {"c_i": c_i}})
    ctx.global_params = w_global
    workspaces = run_client(trainer, algorithm, tiny_data, ctx, steps=3)
    w_i = trainer.space.flatten()
    torch.testing.assert_close(w_i, expected, rtol=0, atol=1e-6)

    state, messages = algorithm.end_client(ctx, workspaces, LocalResult(w_i, 3, w_i - w_global))
    h_new = h + (w_i - w_global)  # h_i += w_i - w^t
    torch.testing.assert_close(state["feddc"]["h"], h_new, rtol=0, atol=1e-7)
    torch.testing.assert_close(messages["feddc"][DELTA_SHIFT], h_new, rtol=0, atol=1e-7)
    torch.testing.assert_close(state["scaffold"]["c_i"], c_i - c - (w_i - w_global) / (3 * LR), rtol=0, atol=1e-6)

    # server: w^{t+1} = mean_i (w_i + h_i) (sampled clients, equal weights); SCAFFOLD's c from the raw deltas
    d1, d2, h1, h2 = (vector(dim, s) for s in (5, 6, 7, 8))
    server_state = algorithm.init_server_state(w_global)
    new_w, server_state = algorithm.server_step(
        0, w_global, [update(0, d1, {"feddc": {DELTA_SHIFT: h1}}), update(1, d2, {"feddc": {DELTA_SHIFT: h2}})],
        torch.tensor([0.5, 0.5]), server_state, 4, learning_rate=LR)
    torch.testing.assert_close(new_w, ((w_global + d1 + h1) + (w_global + d2 + h2)) / 2, rtol=0, atol=1e-7)
    torch.testing.assert_close(server_state["scaffold"]["c"], -(d1 + d2) / (4 * 2 * LR), rtol=0, atol=1e-6)


def test_feddc_with_sam_adds_the_drift_and_scaffold_terms_to_the_sam_gradient(tmp_path, tiny_model, tiny_data):
    alpha, rho = 0.3, 0.2
    args, trainer, algorithm, x, y, w0 = setup(tmp_path, tiny_model, tiny_data, fed_algorithm="feddc",
                                               perturbation="sam", rho=rho, feddc_alpha=alpha)
    assert algorithm.describe()["perturbation"] == "sam" and algorithm.passes_per_step == 2
    dim = w0.numel()
    w_global = w0 + vector(dim, 1)
    h, c, c_i = vector(dim, 2), vector(dim, 3), vector(dim, 4)
    g = lambda w: grad_of(lambda p: tiny_loss(tiny_model, p, x, y), trainer, w)  # noqa: E731

    def direction(w):  # SAM's g(w + rho g/||g||), then alpha (w + h_i - w^t) + (c - c_i)
        g1 = g(w)
        return g(w + rho * g1 / (g1.norm() + EPS)) + alpha * (w + h - w_global) + (c - c_i)

    ctx = context(trainer, broadcast={"scaffold": {"c": c}}, state={"feddc": {"h": h}, "scaffold": {"c_i": c_i}})
    ctx.global_params = w_global
    run_client(trainer, algorithm, tiny_data, ctx, steps=3)
    torch.testing.assert_close(trainer.space.flatten(), descend(w0, 3, direction), rtol=0, atol=1e-6)
