"""FedSpeed's merged gradient (``fedspeed_sam``): ``d = (1 - alpha) g_1 + alpha g_2``; with alpha = 1 it is SAM's.
(The merged gradient with FedSpeed's correction, state and message: ``tests/corrections/test_fedspeed.py``.)"""

from __future__ import annotations

import torch

from conftest import TinyClassifier, tiny_loss
from step_helpers import EPS, context, descend, grad_of, run_client, setup, vector


def test_fedspeed_alpha_one_is_its_prox_correction_on_the_sam_gradient(tmp_path, tiny_model, tiny_data):
    """FedSpeed's merged gradient with alpha = 1 is SAM's: ``--fedspeed_alpha 1`` and ``--perturbation sam`` give the
    same weights (the FL-Simulator code steps with the perturbed gradient alone)."""
    rho, lam = 0.2, 2.0
    dim = None
    results = []
    for extra in ({"fedspeed_alpha": 1.0}, {"perturbation": "sam"}):
        torch.manual_seed(0)
        model = TinyClassifier()
        args, trainer, algorithm, x, y, w0 = setup(tmp_path / str(len(results)), model, tiny_data,
                                                   fed_algorithm="fedspeed", rho=rho, fedspeed_lambda=lam, **extra)
        dim = w0.numel()
        ctx = context(trainer, state={"fedspeed": {"g_hat": vector(dim, 2)}})
        ctx.global_params = w0 + vector(dim, 1)
        run_client(trainer, algorithm, tiny_data, ctx, steps=2)
        results.append(trainer.space.flatten())
    g = lambda w: grad_of(lambda p: tiny_loss(model, p, x, y), trainer, w)  # noqa: E731

    def direction(w):
        g1 = g(w)
        return g(w + rho * g1 / (g1.norm() + EPS)) - vector(dim, 2) + (w - (w0 + vector(dim, 1))) / lam

    torch.testing.assert_close(results[0], descend(w0, 2, direction), rtol=0, atol=1e-6)
    torch.testing.assert_close(results[1], results[0], rtol=0, atol=1e-7)
