"""FedDyn's client term (``feddyn``): ``d = g + alpha (w - w^t) + alpha h`` and ``h_i += w_i - w^t``, computed by
hand. (The server rule: ``tests/aggregators/test_feddyn.py``.)"""

from __future__ import annotations

import torch

from hf_fedflat.algorithms import LocalResult

from step_helpers import context, descend, grad_at, run_client, setup, vector


def test_feddyn_term_and_client_state(tmp_path, tiny_model, tiny_data):
    alpha = 0.5
    args, trainer, algorithm, x, y, w0 = setup(tmp_path, tiny_model, tiny_data, fed_algorithm="feddyn",
                                               feddyn_alpha=alpha)
    h = vector(w0.numel(), 6)
    expected = descend(w0, 3, lambda w: grad_at(tiny_model, trainer, w, x, y) + alpha * (w - w0) + alpha * h)
    ctx = context(trainer, state={"feddyn": {"h": h}})
    workspaces = run_client(trainer, algorithm, tiny_data, ctx, steps=3)
    w_local = trainer.space.flatten()
    torch.testing.assert_close(w_local, expected, rtol=0, atol=1e-6)
    state, _ = algorithm.end_client(ctx, workspaces, LocalResult(w_local, 3, w_local - ctx.global_params))
    torch.testing.assert_close(state["feddyn"]["h"], h + (w_local - w0), rtol=0, atol=1e-6)
