"""The fast step form (``runtime.fast_step``) equals the reference (``training.step``): every correction's formula
evaluated on ``p.grad`` in place and on flat vectors gives the same bits, and every preset's pieces give the same
``p.grad``, losses and workspaces through both forms."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from hf_fedflat.algorithms import ClientContext, LocalResult, build_algorithm, list_algorithms

from step_helpers import step_in_form, tiny_setup, vector


def test_in_place_and_flat_evaluations_are_bit_identical():
    """Every correction's one formula, evaluated on p.grad in place and on flat vectors: the same bits."""
    model, space, x, y, backward = tiny_setup()
    args = SimpleNamespace(fed_algorithm="fedavg", corrections="prox,scaffold,feddyn,fedup,momentum")
    algorithm = build_algorithm(args)
    dim = space.numel
    ctx = ClientContext(0, 1, space.flatten() + vector(dim, 1), learning_rate=0.05, num_samples=8,
                        broadcast={"scaffold": {"c": vector(dim, 2)}, "fedup": {"last_update": vector(dim, 3)},
                                   "momentum": {"m": vector(dim, 4), "ready": torch.ones(1)}},
                        state={"scaffold": {"c_i": vector(dim, 5)}, "feddyn": {"h": vector(dim, 6)}})
    workspaces = algorithm.begin_client(ctx)
    grads = []
    for form in ("fast", "reference"):
        space.clear_grad()
        step_in_form(form, space, algorithm, workspaces, backward, bias_scale=lambda: 0.375)
        grads.append(space.grad())
    assert torch.equal(grads[0], grads[1])
    space.clear_grad()
    backward()
    assert (grads[0] - space.grad()).abs().max() > 1e-3  # the corrections did something


def client_context(algorithm, w, full_gradient=None):
    """A client that took part before: every client piece's server state and client state (from its own ``end``)
    with random values, as its ``begin`` would receive them."""
    g = torch.Generator().manual_seed(11)

    def noisy(parts):
        return {key: 0.01 * torch.randn(value.shape, generator=g) for key, value in parts.items()}

    broadcast = {piece.name: noisy(piece.broadcast(piece.init_server_state(w))) for piece in algorithm.client_pieces}
    ctx = ClientContext(0, 1, w, broadcast, {}, learning_rate=0.1, num_samples=8, full_gradient=full_gradient)
    result = LocalResult(w, 1, 0.01 * torch.randn(w.shape, generator=g))
    state, _ = algorithm.end_client(ctx, algorithm.begin_client(ctx), result)
    ctx.state = {name: noisy(part) for name, part in state.items()}
    return ctx


def presets_with_client_steps():
    return sorted(list_algorithms())


@pytest.mark.parametrize("preset", presets_with_client_steps())
def test_fast_step_is_bit_identical_to_the_reference_for_every_presets_pieces(preset):
    """Two micro-batches of one optimizer step (the second adds to what p.grad holds), from the same weights and
    workspaces: the same p.grad, losses and workspaces bit for bit through both forms."""
    outcomes = {}
    for form in ("reference", "fast"):
        model, space, x, y, backward = tiny_setup()

        def forward():
            return model(x, labels=y)["loss"]

        algorithm = build_algorithm(SimpleNamespace(fed_algorithm=preset, num_clients=4, seed=0))
        w = space.flatten()
        ctx = client_context(algorithm, w + vector(space.numel, 1), full_gradient=lambda: vector(space.numel, 2))
        workspaces = algorithm.begin_client(ctx)
        results = [step_in_form(form, space, algorithm, workspaces, backward, bias_scale=lambda: 0.5,
                                forward=forward) for _ in range(2)]
        assert torch.equal(space.flatten(), w)  # every pass left w untouched
        outcomes[form] = (space.grad(), [r.loss for r in results], [r.gradient_passes for r in results],
                          workspaces)
    (reference, reference_losses, reference_passes, reference_ws), (fast, fast_losses, fast_passes, fast_ws) = (
        outcomes["reference"], outcomes["fast"])
    assert torch.equal(fast, reference)
    assert all(torch.equal(a, b) for a, b in zip(fast_losses, reference_losses))
    assert fast_passes == reference_passes
    for name, workspace in reference_ws.items():
        if isinstance(workspace, dict):
            for key, value in workspace.items():
                if isinstance(value, torch.Tensor):
                    assert torch.equal(fast_ws[name][key], value), (name, key)
