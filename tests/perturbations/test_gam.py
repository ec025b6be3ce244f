"""GAM (``gam``, the FedGAM form, and ``gam_original``, the accelerated form of the GAM paper) against the paper's
formula (docs/algorithms.md), computed by hand.

The tiny model sees its whole 8-sample dataset as one batch, so every local step's gradient is the full-data
gradient at the current weights, which the tests compute independently with autograd.
"""

from __future__ import annotations

import torch

from hf_fedflat import FedTrainingArguments

from step_helpers import context, descend, grad_at, run_client, setup, unit


def test_gam_fedgam_form(tmp_path, tiny_model, tiny_data):
    rho, alpha = 0.3, 0.5
    args, trainer, algorithm, x, y, w0 = setup(tmp_path, tiny_model, tiny_data, fed_algorithm="fedgam", rho=rho,
                                               gam_alpha=alpha)
    g = lambda w: grad_at(tiny_model, trainer, w, x, y)  # noqa: E731
    expected = descend(w0, 2, lambda w: g(w) + alpha * rho * g(w + rho * unit(g(w))))
    run_client(trainer, algorithm, tiny_data, context(trainer), steps=2)
    torch.testing.assert_close(trainer.space.flatten(), expected, rtol=0, atol=1e-6)
    assert trainer.gradient_passes == 4 and algorithm.passes_per_step == 2
    assert args.rho == rho and FedTrainingArguments(output_dir=str(tmp_path), use_cpu=True,
                                                    fed_algorithm="fedgam").rho == 0.02


def test_gam_original_accelerated_form(tmp_path, tiny_model, tiny_data):
    rho, rho_p, a, b, gamma = 0.3, 0.05, 0.2, 0.3, 0.4
    args, trainer, algorithm, x, y, w0 = setup(
        tmp_path, tiny_model, tiny_data, perturbation="gam_original", rho=rho, gam_rho_prime=rho_p,
        gam_grad_alpha=a, gam_grad_beta=b, gam_gamma=gamma,
    )
    g = lambda w: grad_at(tiny_model, trainer, w, x, y)  # noqa: E731

    def direction(w):
        g0 = g(w)
        g1 = g(w + rho_p * unit(g0))
        w2 = w + rho * unit(g1 - g0)
        g2 = g(w2)
        g3 = g(w2 + rho_p * unit(g2))
        h_plus, h_minus = a * g1 + (1 - a) * g3, b * g0 + (1 - b) * g2
        orthogonal = h_minus - (h_minus @ h_plus) / (h_plus @ h_plus) * h_plus
        return h_plus - gamma * orthogonal

    run_client(trainer, algorithm, tiny_data, context(trainer), steps=2)
    torch.testing.assert_close(trainer.space.flatten(), descend(w0, 2, direction), rtol=0, atol=1e-6)
    assert trainer.gradient_passes == 8
