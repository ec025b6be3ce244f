"""The step function without a Trainer (``training.step``): its reference form against the formula computed by
hand, the plain path, earlier micro-batches, and a perturbation written in a test (FedASAM, one file's worth) that
reads the weights from the gradient oracle. Both step forms run where the test says so (the fast form's own
equality with the reference: ``tests/runtime/test_fast_step.py``)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from hf_fedflat.algorithms import (
    ClientContext, FederatedAlgorithm, Perturbation, PieceConfig, build_algorithm, global_norm, hyperparameter,
)
from hf_fedflat.algorithms.base import EPS, RHO_HELP
from hf_fedflat.training.step import takes_plain_step, training_step

from step_helpers import flat, hand_grad, step_in_form, tiny_setup, vector


@pytest.mark.parametrize("form", ["fast", "reference"])
def test_step_function_without_a_trainer_equals_the_formula(form):
    """LESAM's fixed offset, then prox, SCAFFOLD and momentum, at bias scale 0.5: on the tiny model, no Trainer."""
    model, space, x, y, backward = tiny_setup()
    args = SimpleNamespace(fed_algorithm="fedlesam", corrections="prox,scaffold,momentum", rho=0.2, prox_mu=0.3,
                           scaffold_lambda=0.7, momentum_alpha=0.4, lesam_direction=None)
    algorithm = build_algorithm(args)
    w0 = space.flatten()
    dim = space.numel
    w_global = w0 + vector(dim, 1)  # the client's weights are not w^t: the prox term is non-zero
    w_old, c, c_i, m = vector(dim, 2, 1.0) + w_global, vector(dim, 3), vector(dim, 4), vector(dim, 5)
    ctx = ClientContext(0, 1, w_global, broadcast={"scaffold": {"c": c}, "momentum": {"m": m, "ready": torch.ones(1)}},
                        state={"lesam": {"w_old": w_old}, "scaffold": {"c_i": c_i}}, learning_rate=0.1, num_samples=8)
    workspaces = algorithm.begin_client(ctx)
    b, rho, mu, lam, a = 0.5, 0.2, 0.3, 0.7, 0.4

    e = rho * (w_old - w_global) / ((w_old - w_global).norm() + 1e-12)
    g = flat(hand_grad(model, space.split(w0 + e), x, y))
    d = g + mu * b * (w0 - w_global) + lam * b * (c - c_i)
    expected = a * d + (1 - a) * b * m

    result = step_in_form(form, space, algorithm, workspaces, backward, bias_scale=lambda: b)
    torch.testing.assert_close(space.grad(), expected, rtol=0, atol=1e-6)
    assert result.gradient_passes == 1 and result.in_place == (form == "fast")
    assert torch.equal(space.flatten(), w0)  # the pass at w + e left w untouched
    assert not takes_plain_step(algorithm, workspaces)


def test_step_function_flat_path_adds_earlier_micro_batches():
    """SAM + FedDyn on the second micro-batch of a step: d = g_sam + alpha*b*(w - w^t + h), plus what p.grad held."""
    model, space, x, y, backward = tiny_setup()
    algorithm = build_algorithm(SimpleNamespace(fed_algorithm="fedsam", corrections="feddyn", rho=0.3,
                                                feddyn_alpha=0.2))
    w0, dim = space.flatten(), space.numel
    w_global, h = w0 + vector(dim, 7), vector(dim, 8)
    workspaces = algorithm.begin_client(ClientContext(0, 1, w_global, {}, {"feddyn": {"h": h}}, 0.1, 8))
    earlier = vector(dim, 9, 1.0)
    space.set_grad_(earlier.clone())
    b = 0.5
    g = flat(hand_grad(model, space.split(w0), x, y))
    g_sam = flat(hand_grad(model, space.split(w0 + 0.3 * g / (g.norm() + 1e-12)), x, y))
    expected = g_sam + 0.2 * b * (w0 - w_global + h) + earlier
    result = training_step(space, algorithm, workspaces, backward, bias_scale=lambda: b)
    torch.testing.assert_close(space.grad(), expected, rtol=0, atol=1e-6)
    assert result.gradient_passes == 2 and not result.in_place


def test_step_function_plain_path_is_the_backward_alone():
    model, space, x, y, backward = tiny_setup()
    algorithm = build_algorithm(SimpleNamespace(fed_algorithm="fedavg"))
    workspaces = algorithm.begin_client(ClientContext(0, 0, space.flatten(), {}, {}, 0.1, 8))
    asked = []
    result = training_step(space, algorithm, workspaces, backward, bias_scale=lambda: asked.append(1) or 1.0)
    torch.testing.assert_close(space.grad(), flat(hand_grad(model, list(model.parameters()), x, y)), rtol=0, atol=1e-6)
    assert takes_plain_step(algorithm, workspaces) and result.gradient_passes == 1 and not result.in_place
    assert not asked  # no correction: the loss scale is never asked for (a GPU sync)


# --- a perturbation written in a test, as one piece file would be ------------------------------------------
@dataclasses.dataclass
class AdaptiveSAMConfig(PieceConfig):
    rho: float = hyperparameter(0.5, RHO_HELP)
    asam_eta: float = hyperparameter(0.01, "ASAM: eta of the normalisation T = |w| + eta.")


class AdaptiveSAMPerturbation(Perturbation):
    """FedASAM's step (Kwon et al., ASAM, ICML 2021; in FL Caldarola et al., ECCV 2022): ``T = |w| + eta``
    (elementwise), ``e = rho * T^2 g / ||T g||``, ``d = grad F(w + e; B)``. Not registered (it would add flags to
    every run of the test session)."""

    name = "asam"
    passes_per_step = 2
    config_class = AdaptiveSAMConfig

    def direction(self, grad_at, workspace):
        c = self.config
        loss, g = grad_at(None)
        t = grad_at.weights().abs().add_(c.asam_eta)
        tg = t * g
        _, g_asam = grad_at(t * tg * (c.rho / (global_norm(tg) + EPS)))
        return loss, g_asam


@pytest.mark.parametrize("form", ["reference", "fast"])
def test_an_adaptive_perturbation_reads_the_weights_from_the_oracle(form, monkeypatch):
    """FedASAM in one test-local class through both step forms, with FedProx (which reads ``W`` too): the step equals
    the formula by hand, and the weights are copied once for both."""
    model, space, x, y, backward = tiny_setup()
    rho, eta, mu = 0.5, 0.01, 0.3
    prox = build_algorithm(SimpleNamespace(fed_algorithm="fedprox", prox_mu=mu)).corrections
    algorithm = FederatedAlgorithm("fedasam_prox", AdaptiveSAMPerturbation(AdaptiveSAMConfig(rho, eta)), prox,
                                   build_algorithm(SimpleNamespace(fed_algorithm="fedavg")).aggregator)
    w = space.flatten()
    w_global = w + vector(space.numel, 3)
    workspaces = algorithm.begin_client(ClientContext(0, 0, w_global, {}, {}, 0.1, 8))

    g = flat(hand_grad(model, space.split(w), x, y))
    t = w.abs() + eta
    e = rho * t * t * g / (t * g).norm()
    expected = flat(hand_grad(model, space.split(w + e), x, y)) + mu * (w - w_global)

    copies = []
    flatten = space.flatten
    monkeypatch.setattr(space, "flatten", lambda out=None: copies.append(1) or flatten(out=out))
    result = step_in_form(form, space, algorithm, workspaces, backward)
    torch.testing.assert_close(space.grad(), expected, rtol=0, atol=1e-6)
    assert result.gradient_passes == 2 and len(copies) == 1
    assert (e.abs() / (rho * g.abs() / g.norm())).std() > 0.1  # the offset is not SAM's: T reweights it
