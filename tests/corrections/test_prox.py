"""FedProx's proximal term (``prox``): ``d = g + mu (w - w^t)``, computed by hand on the tiny model."""

from __future__ import annotations

import torch

from step_helpers import context, descend, grad_at, run_client, setup


def test_prox_term(tmp_path, tiny_model, tiny_data):
    mu = 0.7
    args, trainer, algorithm, x, y, w0 = setup(tmp_path, tiny_model, tiny_data, fed_algorithm="fedprox", prox_mu=mu)
    expected = descend(w0, 3, lambda w: grad_at(tiny_model, trainer, w, x, y) + mu * (w - w0))
    run_client(trainer, algorithm, tiny_data, context(trainer), steps=3)
    torch.testing.assert_close(trainer.space.flatten(), expected, rtol=0, atol=1e-6)
