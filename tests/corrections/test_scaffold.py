"""SCAFFOLD (``scaffold``): the step ``d = g + lambda (c - c_i)``, the client's new ``c_i`` (option II) and the
server's ``c``, computed by hand from the paper's formula (docs/algorithms.md)."""

from __future__ import annotations

import pytest
import torch

from hf_fedflat import FedTrainingArguments, build_algorithm
from hf_fedflat.algorithms import ClientUpdate, LocalResult

from step_helpers import LR, context, flat, hand_grad, make_trainer, run_client


def test_scaffold_step_state_and_server_update_equal_formulas(tmp_path, tiny_model, tiny_data):
    args, trainer = make_trainer(tmp_path, tiny_model, fed_algorithm="scaffold", scaffold_lambda=0.7)
    algorithm = build_algorithm(args)
    x, y = tiny_data[:]["x"], tiny_data[:]["labels"]
    dim = trainer.space.numel
    gen = torch.Generator().manual_seed(1)
    c, c_i = 0.1 * torch.randn(dim, generator=gen), 0.1 * torch.randn(dim, generator=gen)
    w0 = trainer.space.flatten()
    ctx = context(trainer, broadcast={"scaffold": {"c": c}}, state={"scaffold": {"c_i": c_i}})

    steps = 3
    w = [p.detach().clone() for p in tiny_model.parameters()]
    for _ in range(steps):
        d = flat(hand_grad(tiny_model, w, x, y)) + 0.7 * (c - c_i)
        w = [wi - LR * di for wi, di in zip(w, trainer.space.split(d))]
    workspaces = run_client(trainer, algorithm, tiny_data, ctx, steps=steps)
    w_local = trainer.space.flatten()
    torch.testing.assert_close(w_local, flat(w), rtol=0, atol=1e-6)

    state, messages = algorithm.end_client(ctx, workspaces, LocalResult(params=w_local, num_steps=steps, delta=w_local - ctx.global_params))
    expected_ci = c_i - c + (w0 - w_local) / (steps * LR)
    torch.testing.assert_close(state["scaffold"]["c_i"], expected_ci, rtol=0, atol=1e-6)
    assert messages == {}  # dc_i is a function of the update: the server computes it

    # server: c += (1/N) sum dc_i over the sampled clients, N = all clients, dc_i = c_i+ - c_i of each
    # client (option II); a client without steps has dc_i = 0
    other_delta, other_steps = 0.01 * torch.randn(dim, generator=gen), 5
    other_dc = -c + (-other_delta) / (other_steps * LR)
    updates = [
        ClientUpdate(0, 8, steps, 0.0, w_local - w0, messages=messages),
        ClientUpdate(1, 8, other_steps, 0.0, other_delta),
        ClientUpdate(2, 8, 0, 0.0, torch.zeros(dim)),
    ]
    weights = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    new_params, server_state = algorithm.server_step(
        0, w0, updates, weights, {"scaffold": {"c": c}}, num_clients=5, learning_rate=LR
    )
    torch.testing.assert_close(server_state["scaffold"]["c"], c + (expected_ci - c_i + other_dc) / 5, rtol=0, atol=1e-6)
    torch.testing.assert_close(new_params, w0 + 0.5 * (w_local - w0) + 0.25 * other_delta, rtol=0, atol=1e-6)
    # without the round's learning rate the server cannot recover dc_i: a clear error, not a silent c
    with pytest.raises(ValueError, match="learning rate"):
        algorithm.server_step(0, w0, updates, weights, {"scaffold": {"c": c}}, num_clients=5)


def test_scaffold_first_participation_starts_from_zero_control_variate(tmp_path, tiny_model, tiny_data):
    """No stored c_i: the step uses c - 0, and the new c_i equals dc (the two may be one tensor)."""
    args, trainer = make_trainer(tmp_path, tiny_model, fed_algorithm="scaffold")
    algorithm = build_algorithm(args)
    x, y = tiny_data[:]["x"], tiny_data[:]["labels"]
    c = 0.1 * torch.randn(trainer.space.numel, generator=torch.Generator().manual_seed(2))
    w0 = trainer.space.flatten()
    ctx = context(trainer, broadcast={"scaffold": {"c": c}})
    steps = 2
    w = [p.detach().clone() for p in tiny_model.parameters()]
    for _ in range(steps):
        d = flat(hand_grad(tiny_model, w, x, y)) + c
        w = [wi - LR * di for wi, di in zip(w, trainer.space.split(d))]
    workspaces = run_client(trainer, algorithm, tiny_data, ctx, steps=steps)
    w_local = trainer.space.flatten()
    torch.testing.assert_close(w_local, flat(w), rtol=0, atol=1e-6)
    state, messages = algorithm.end_client(ctx, workspaces, LocalResult(params=w_local, num_steps=steps, delta=w_local - ctx.global_params))
    expected_ci = -c + (w0 - w_local) / (steps * LR)
    torch.testing.assert_close(state["scaffold"]["c_i"], expected_ci, rtol=0, atol=1e-6)
    assert messages == {}
    assert float(c.abs().max()) > 1e-3  # c really enters the step


# --- the server control variate (FedGAM-CV: seed 000 eq. (22), Alg. 2) ----------------------------------------
def scaffold_server(tmp_path, **overrides):
    return build_algorithm(FedTrainingArguments(output_dir=str(tmp_path), use_cpu=True, num_clients=10,
                                                clients_per_round=3, **overrides))


@pytest.mark.parametrize("preset, average, divisor", [
    ("fedgam_cv", None, 3), ("scaffold", None, 10), ("fedgam_cv", "all_clients", 10), ("scaffold", "sampled", 3),
])
def test_server_control_variate_average(tmp_path, preset, average, divisor):
    overrides = {} if average is None else {"scaffold_server_average": average}
    algorithm = scaffold_server(tmp_path, fed_algorithm=preset, **overrides)
    w = torch.zeros(6, dtype=torch.float64)
    c = torch.linspace(-0.3, 0.4, 6, dtype=torch.float64)
    state = {"scaffold": {"c": c.clone()}}
    steps, eta = (2, 3, 5), 0.05
    updates = [ClientUpdate(i, 10, k, 0.0, torch.randn(6, generator=torch.Generator().manual_seed(i),
                                                         dtype=torch.float64)) for i, k in enumerate(steps)]
    p = torch.full((3,), 1 / 3, dtype=torch.float64)
    _, new_state = algorithm.server_step(0, w, updates, p, state, num_clients=10, learning_rate=eta)
    # c += (1/M) sum_i dc_i, dc_i = c_i+ - c_i = -c - Delta_i / (K_i * eta)  (option II)
    dc = [-c - u.delta / (u.num_steps * eta) for u in updates]
    expected = c + sum(dc) / divisor
    torch.testing.assert_close(new_state["scaffold"]["c"], expected, rtol=0, atol=1e-14)
