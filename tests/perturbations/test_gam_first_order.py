"""DFedGAM's step (``gam_first_order``, eq. (7)-(8), Algorithm 1 of the DFedGAM paper) as the paper defines it.

Every expected value is computed here from the paper's formula, independently of the code under test: the
Hessian of the tiny model by ``torch.autograd.functional.hessian`` (a full matrix, not a double backward), in
float64 where the arithmetic allows.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from hf_fedflat import FedTrainingArguments, build_algorithm
from hf_fedflat.training import ParameterSpace
from hf_fedflat.training.step import training_step

from conftest import TinyClassifier, make_tiny_dataset, tiny_loss
from step_helpers import LR, context, make_trainer, run_client, unit


def float64_setup(seed: int = 0):
    torch.manual_seed(seed)
    model = TinyClassifier().double()
    data = make_tiny_dataset()
    x, y = data[:]["x"].double(), data[:]["labels"]
    space = ParameterSpace(model)

    def backward():
        loss = model(x, labels=y)["loss"]
        loss.backward()
        return loss.detach()

    def forward():
        return model(x, labels=y)["loss"]

    return model, space, x, y, backward, forward


def flat_loss(model, space, x, y):
    """The loss as a function of the flat parameter vector."""
    return lambda w: tiny_loss(model, space.split(w), x, y)


def gradient(loss, w):
    w = w.detach().clone().requires_grad_(True)
    return torch.autograd.grad(loss(w), w)[0]


def hessian(loss, w):
    return torch.autograd.functional.hessian(loss, w.detach().clone())


def dfedgam_direction(loss, w, rho):
    """The paper's step direction: ``grad F(w + rho * grad||g|| / ||grad||g||||)`` with ``grad||g|| = H g/||g||``."""
    g = gradient(loss, w)
    grad_norm_g = hessian(loss, w) @ g / g.norm()
    return gradient(loss, w + rho * grad_norm_g / grad_norm_g.norm())


def test_dfedgam_double_backward_step_is_the_papers_on_float64():
    model, space, x, y, backward, forward = float64_setup()
    rho = 0.5
    algorithm = build_algorithm(SimpleNamespace(fed_algorithm="dfedgam", rho=rho, hvp_mode=None))
    w = space.flatten()
    loss = flat_loss(model, space, x, y)
    expected = dfedgam_direction(loss, w, rho)
    result = training_step(space, algorithm, algorithm.begin_client(None), backward, forward=forward)
    torch.testing.assert_close(space.grad(), expected, rtol=0, atol=1e-11)
    assert result.gradient_passes == 3 == algorithm.passes_per_step
    assert torch.equal(space.flatten(), w)  # the weights are restored after the perturbed pass
    # no alpha and no g + term: the FedGAM form (seed 000 eq. 19) is a different direction here
    g = gradient(loss, w)
    fedgam = g + 0.2 * rho * gradient(loss, w + rho * unit(g))
    assert (expected - fedgam).norm() > 0.1 * expected.norm()
    assert (expected - gradient(loss, w + rho * unit(g))).norm() > 1e-3  # nor SAM's ascent direction


def test_dfedgam_finite_difference_option_on_float64():
    model, space, x, y, backward, forward = float64_setup()
    rho, r = 0.5, 1e-3
    algorithm = build_algorithm(SimpleNamespace(fed_algorithm="dfedgam", rho=rho, hvp_mode="finite_difference",
                                                hvp_radius=r))
    w = space.flatten()
    loss = flat_loss(model, space, x, y)
    g = gradient(loss, w)
    approx = (gradient(loss, w + r * g / g.norm()) - g) / r
    expected = gradient(loss, w + rho * approx / approx.norm())
    result = training_step(space, algorithm, algorithm.begin_client(None), backward)  # gradients only: no forward
    torch.testing.assert_close(space.grad(), expected, rtol=0, atol=1e-11)
    assert result.gradient_passes == 3
    # the finite difference approaches the exact H g/||g|| as r -> 0
    exact = hessian(loss, w) @ g / g.norm()
    assert torch.nn.functional.cosine_similarity(approx, exact, dim=0) > 0.999
    torch.testing.assert_close(space.grad(), dfedgam_direction(loss, w, rho), rtol=0, atol=1e-3)


def test_dfedgam_double_backward_needs_the_forward_closure():
    model, space, x, y, backward, forward = float64_setup()
    algorithm = build_algorithm(SimpleNamespace(fed_algorithm="dfedgam", rho=0.1, hvp_mode=None))
    with pytest.raises(TypeError, match="forward"):
        training_step(space, algorithm, algorithm.begin_client(None), backward)
    with pytest.raises(ValueError, match="^hvp_mode: "):
        FedTrainingArguments(output_dir="/tmp/unused", use_cpu=True, fed_algorithm="dfedgam", hvp_mode="exact")
    with pytest.raises(ValueError, match="^hvp_radius: "):
        FedTrainingArguments(output_dir="/tmp/unused", use_cpu=True, fed_algorithm="dfedgam", hvp_radius=0.0)


def test_dfedgam_client_trainer_takes_two_paper_steps(tmp_path, tiny_model, tiny_data):
    """Through the Trainer (float32, the whole 8-sample dataset as one batch): y -= eta * grad F(y + delta), twice."""
    rho = 0.3
    args, trainer = make_trainer(tmp_path, tiny_model, fed_algorithm="dfedgam", rho=rho)
    algorithm = build_algorithm(args)
    x, y = tiny_data[:]["x"].double(), tiny_data[:]["labels"]
    reference = TinyClassifier().double()
    space64 = ParameterSpace(reference)
    loss = flat_loss(reference, space64, x, y)
    w = trainer.space.flatten().double()
    for _ in range(2):
        w = w - LR * dfedgam_direction(loss, w, rho)
    run_client(trainer, algorithm, tiny_data, context(trainer), steps=2)
    torch.testing.assert_close(trainer.space.flatten().double(), w, rtol=0, atol=1e-6)
    assert trainer.gradient_passes == 6
