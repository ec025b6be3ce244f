"""Adaptive SAM (``asam``, FedASAM's client step): ``T = |w| + eta_a`` on weight tensors and ``1`` on biases,
``e = rho T^2 g / ||T g||``, ``d = grad F(w + e)``; computed by hand on the tiny model (docs/algorithms.md)."""

from __future__ import annotations

import pytest
import torch

from hf_fedflat.training import ParameterSpace

from step_helpers import EPS, LR, context, flat, hand_grad, run_client, setup, small_run


def asam_direction(model, params, x, y, rho, eta):
    """The hand formula over the tiny model's ``[W1, b1, W2, b2]``: the two weight matrices get ``|w| + eta``."""
    g = hand_grad(model, params, x, y)
    scales = [p.abs() + eta if p.dim() == 2 else torch.ones_like(p) for p in params]
    norm = flat([s * gi for s, gi in zip(scales, g)]).norm()
    offset = [rho * s * s * gi / (norm + EPS) for s, gi in zip(scales, g)]
    return hand_grad(model, [p + e for p, e in zip(params, offset)], x, y), g


def test_asam_steps_equal_the_hand_formula(tmp_path, tiny_model, tiny_data):
    rho, eta = 0.5, 0.3
    args, trainer, algorithm, x, y, w0 = setup(tmp_path, tiny_model, tiny_data, fed_algorithm="fedasam", rho=rho,
                                               asam_eta=eta)
    params = [p.detach().clone() for p in tiny_model.parameters()]
    start = params
    for _ in range(2):
        direction, _ = asam_direction(tiny_model, params, x, y, rho, eta)
        params = [p - LR * d for p, d in zip(params, direction)]
    run_client(trainer, algorithm, tiny_data, context(trainer), steps=2)
    torch.testing.assert_close(trainer.space.flatten(), flat(params), rtol=0, atol=1e-6)
    assert trainer.gradient_passes == 4
    # the adaptive step differs from SAM's (the scale is not uniform), so the check has teeth
    first, g = asam_direction(tiny_model, start, x, y, rho, eta)
    sam = hand_grad(tiny_model, [p + rho * gi / (flat(g).norm() + EPS) for p, gi in zip(start, g)], x, y)
    assert (flat(first) - flat(sam)).abs().max() > 1e-4


def test_the_preset_uses_the_papers_cifar_settings(tmp_path, tiny_model, tiny_data):
    args, _, algorithm, *_ = setup(tmp_path, tiny_model, tiny_data, fed_algorithm="fedasam")
    assert (algorithm.perturbation.name, algorithm.perturbation.config.rho, algorithm.perturbation.config.asam_eta,
            algorithm.aggregator.name, args.aggregation_weights) == ("asam", 0.7, 0.2, "mean", "samples")


def test_the_weight_mask_follows_the_parameter_names(tiny_model):
    space = ParameterSpace(tiny_model)  # net.0.weight (5x4), net.0.bias (5), net.2.weight (3x5), net.2.bias (3)
    mask = space.parameter_mask("weight")
    expected = torch.cat([torch.ones(20), torch.zeros(5), torch.ones(15), torch.zeros(3)]).bool()
    assert torch.equal(mask, expected)
    assert space.parameter_mask("weight") is mask  # built once


@pytest.mark.parametrize("settings", [
    dict(perturbation="asam", corrections="scaffold"), dict(fed_algorithm="fedasam+fedgh"),
    dict(fed_algorithm="dfedavg", perturbation="asam"), dict(fed_algorithm="fedgmt", perturbation="asam"),
    dict(fed_algorithm="fedwmsam", aggregator="mean+fedgh"),
], ids=["scaffold", "fedgh", "decentralized", "fedgmt", "fedwmsam_fedgh"])
def test_the_new_pieces_compose(tmp_path, settings):
    trainer, output = small_run(tmp_path, num_rounds=2, num_clients=4, clients_per_round=2, **settings)
    assert torch.isfinite(output.params).all() and len(trainer.history) == 2
    algorithm = trainer.algorithm
    assert algorithm.perturbation.name == settings.get("perturbation", algorithm.perturbation.name)
