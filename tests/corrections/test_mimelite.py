"""MimeLite (``mimelite``): local steps with the server momentum ``d = (1 - beta) g + beta m``, the full-batch
gradient at ``w^t`` each client sends and the server's ``m``, computed by hand, on their own and over two rounds of
the real round loop."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hf_fedflat.algorithms import LocalResult

from conftest import TinyClassifier, tiny_loss
from helpers.runs import TRAIN, run
from step_helpers import EPS, LR, context, descend, flat, grad_of, run_client, setup, update, vector


def test_mimelite_steps_with_the_server_momentum_and_sends_the_full_gradient(tmp_path, tiny_model, tiny_data):
    beta = 0.7
    args, trainer, algorithm, x, y, w0 = setup(tmp_path, tiny_model, tiny_data, fed_algorithm="mimelite",
                                               mime_beta=beta, per_device_eval_batch_size=3)
    assert args.aggregation_weights == "uniform"
    m = vector(w0.numel(), 1)
    g = lambda w: grad_of(lambda p: tiny_loss(tiny_model, p, x, y), trainer, w)  # noqa: E731
    expected = descend(w0, 3, lambda w: (1 - beta) * g(w) + beta * m)  # m fixed during local training
    ctx = context(trainer, broadcast={"mimelite": {"m": m}})
    ctx.full_gradient = lambda: trainer.full_gradient(tiny_data)  # batches of 3, 3, 2 rows
    workspaces = run_client(trainer, algorithm, tiny_data, ctx, steps=3)
    w_i = trainer.space.flatten()
    torch.testing.assert_close(w_i, expected, rtol=0, atol=1e-6)
    _, messages = algorithm.end_client(ctx, workspaces, LocalResult(w_i, 3, w_i - w0))
    torch.testing.assert_close(messages["mimelite"]["grad"], g(w0), rtol=0, atol=1e-6)  # at x = w^t, all data

    g1, g2, m_old = vector(w0.numel(), 2), vector(w0.numel(), 3), vector(w0.numel(), 4)
    _, state = algorithm.server_step(
        0, w0, [update(0, vector(w0.numel(), 5), {"mimelite": {"grad": g1}}),
                update(1, vector(w0.numel(), 6), {"mimelite": {"grad": g2}})],
        torch.tensor([0.5, 0.5]), {"mimelite": {"m": m_old}}, 2, learning_rate=LR)
    torch.testing.assert_close(state["mimelite"]["m"], (1 - beta) * (g1 + g2) / 2 + beta * m_old, rtol=0, atol=1e-7)


def test_mimelite_with_sam_mixes_the_server_momentum_into_the_sam_gradient(tmp_path, tiny_model, tiny_data):
    beta, rho = 0.7, 0.2
    args, trainer, algorithm, x, y, w0 = setup(tmp_path, tiny_model, tiny_data, fed_algorithm="mimelite",
                                               perturbation="sam", rho=rho, mime_beta=beta)
    m = vector(w0.numel(), 1)
    g = lambda w: grad_of(lambda p: tiny_loss(tiny_model, p, x, y), trainer, w)  # noqa: E731

    def direction(w):
        g1 = g(w)
        return (1 - beta) * g(w + rho * g1 / (g1.norm() + EPS)) + beta * m

    ctx = context(trainer, broadcast={"mimelite": {"m": m}})
    ctx.full_gradient = lambda: trainer.full_gradient(tiny_data)
    workspaces = run_client(trainer, algorithm, tiny_data, ctx, steps=2)
    torch.testing.assert_close(trainer.space.flatten(), descend(w0, 2, direction), rtol=0, atol=1e-6)
    _, messages = algorithm.end_client(ctx, workspaces, LocalResult(trainer.space.flatten(), 2, None))
    torch.testing.assert_close(messages["mimelite"]["grad"], g(w0), rtol=0, atol=1e-6)  # plain, at w^t


def test_mimelite_round_loop_computes_the_full_gradient_at_the_global_model(tmp_path):
    beta = 0.5
    trainer, output = run(tmp_path, fed_algorithm="mimelite", mime_beta=beta, num_clients=2, clients_per_round=2,
                          num_rounds=1, local_steps=1)
    torch.manual_seed(0)
    model = TinyClassifier()
    w0 = [p.detach() for p in model.parameters()]
    grads = []
    for client in range(2):
        rows = TRAIN.select(trainer.partition.client_indices[client].tolist()).with_format("torch")
        params = [p.clone().requires_grad_(True) for p in w0]
        grads.append(flat(torch.autograd.grad(tiny_loss(model, params, rows[:]["x"], rows[:]["labels"]), params)))
    want = (1 - beta) * (grads[0] + grads[1]) / 2  # m starts at 0
    torch.testing.assert_close(trainer.strategy.state["mimelite"]["m"], want, rtol=0, atol=1e-6)


def test_mimelite_two_rounds_match_the_hand_formula(tmp_path):
    """Two rounds, two clients, full-batch local steps: round r starts from w^r with the server momentum m^r
    (m^0 = 0); each client sends grad f_i(w^r) over all its rows and steps K times with (1-beta) g + beta m^r at
    lr_r; the server averages the weights uniformly and sets m^{r+1} = (1-beta) mean_i grad f_i(w^r) + beta m^r."""
    beta, steps, rounds = 0.6, 2, 2
    trainer, output = run(tmp_path, fed_algorithm="mimelite", mime_beta=beta, num_clients=2, clients_per_round=2,
                          num_rounds=rounds, local_steps=steps, per_device_train_batch_size=96,
                          partition_scheme="dirichlet", dirichlet_alpha=0.5, min_partition_size=8)
    torch.manual_seed(0)
    model = TinyClassifier()
    names = [n for n, _ in model.named_parameters()]
    rows = []
    for client in range(2):
        part = TRAIN.select(trainer.partition.client_indices[client].tolist()).with_format("torch")
        rows.append((part[:]["x"], part[:]["labels"]))
    assert len(rows[0][1]) != len(rows[1][1])  # unequal clients: uniform averaging is visible

    def grad(w, x, y):
        w = w.detach().clone().requires_grad_(True)
        out = torch.func.functional_call(model, dict(zip(names, trainer.space.split(w))), (x,))
        return torch.autograd.grad(nn.functional.cross_entropy(out["logits"], y), w)[0]

    w = flat([p.detach() for p in model.parameters()])
    m = torch.zeros_like(w)
    for r in range(rounds):
        lr = 0.1 * 0.9 ** r
        full = [grad(w, x, y) for x, y in rows]
        finals = []
        for x, y in rows:
            w_i = w.clone()
            for _ in range(steps):
                w_i = w_i - lr * ((1 - beta) * grad(w_i, x, y) + beta * m)
            finals.append(w_i)
        w, m = (finals[0] + finals[1]) / 2, (1 - beta) * (full[0] + full[1]) / 2 + beta * m
    torch.testing.assert_close(output.params, w, rtol=0, atol=1e-6)
    torch.testing.assert_close(trainer.strategy.state["mimelite"]["m"], m, rtol=0, atol=1e-6)
    assert m.norm() > 0 and [r["learning_rate"] for r in output.history] == pytest.approx([0.1, 0.09])
