"""FedGMT's client half (``fedgmt``): the local objective ``CE + gamma tau^2 KL(softmax(f_e/tau) ||
softmax(f_w/tau)) + <w, d_m>/beta``, the client's ``d_m``, and the server's moving average ``e``, computed by hand
(docs/algorithms.md). The server rule: ``tests/aggregators/test_fedgmt.py``."""

from __future__ import annotations

import torch
from torch import nn

from hf_fedflat import build_algorithm
from hf_fedflat.algorithms import LocalResult

from step_helpers import context, descend, grad_of, make_trainer, run_client, server, setup, three_updates, vector


def test_fedgmt_local_objective_and_dual(tmp_path, tiny_model, tiny_data):
    gamma, tau, beta = 0.7, 2.0, 5.0
    args, trainer, algorithm, x, y, w0 = setup(tmp_path, tiny_model, tiny_data, fed_algorithm="fedgmt",
                                               fedgmt_gamma=gamma, fedgmt_tau=tau, fedgmt_beta=beta)
    dim = w0.numel()
    ema, dual = w0 + vector(dim, 3, 0.5), vector(dim, 4)
    names = [n for n, _ in tiny_model.named_parameters()]

    def logits(params):
        return torch.func.functional_call(tiny_model, dict(zip(names, params)), (x,))["logits"]

    teacher = torch.softmax(logits(trainer.space.split(ema)) / tau, dim=1)

    def objective(params):
        z = logits(params)
        log_student = torch.log_softmax(z / tau, dim=1)
        kl = (teacher * (teacher.log() - log_student)).sum(dim=1).mean()
        return nn.functional.cross_entropy(z, y) + gamma * tau ** 2 * kl

    expected = descend(w0, 2, lambda w: grad_of(objective, trainer, w) + dual / beta)
    ctx = context(trainer, broadcast={"fedgmt": {"ema": ema}}, state={"fedgmt": {"dual": dual}})
    workspaces = run_client(trainer, algorithm, tiny_data, ctx, steps=2)
    w_local = trainer.space.flatten()
    torch.testing.assert_close(w_local, expected, rtol=0, atol=1e-6)
    # without the distillation and the dual the step would be plain SGD: the check has teeth
    plain = descend(w0, 2, lambda w: grad_of(lambda p: nn.functional.cross_entropy(logits(p), y), trainer, w))
    assert (plain - expected).abs().max() > 1e-3
    state, messages = algorithm.end_client(ctx, workspaces, LocalResult(w_local, 2, w_local - w0))
    torch.testing.assert_close(state["fedgmt"]["dual"], dual + (w_local - w0), rtol=0, atol=0)
    assert messages.get("fedgmt", {}) == {}  # the server keeps the sum of the duals from the deltas


def test_the_moving_average_of_the_global_models_over_rounds(tmp_path):
    a = 0.8
    algorithm = server(tmp_path, fed_algorithm="fedgmt", fedgmt_ema=a)
    w = torch.linspace(0, 1, 6)
    state = algorithm.init_server_state(w)
    ema = w.clone()  # e_0 = w_0
    p = torch.tensor([0.2, 0.3, 0.5])
    for r in range(3):
        updates = three_updates()[r % 2:]  # partial participation: 3, 2, 3 clients
        weights = p[r % 2:] / p[r % 2:].sum()
        w, state = algorithm.server_step(r, w, updates, weights, state, num_clients=5)
        ema = a * ema + (1 - a) * w
        torch.testing.assert_close(state["fedgmt"]["ema"], ema, rtol=0, atol=1e-6)
        torch.testing.assert_close(algorithm.broadcast(state)["fedgmt"]["ema"], ema, rtol=0, atol=1e-6)


def test_fedgmt_on_a_tiny_bert_classifier(tmp_path):
    """One step of a tiny BERT classifier: the teacher's logits come from ``ctx.outputs_at`` (a transformers
    ``ModelOutput``), the step equals the hand objective, clipped to ``max_grad_norm`` like every final direction."""
    import datasets
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(vocab_size=30, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16,
                        num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertForSequenceClassification(config)
    ids, labels = torch.randint(1, 30, (4, 5)), torch.tensor([0, 1, 2, 1])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 0, 0, 0]])
    data = datasets.Dataset.from_dict({"input_ids": ids.tolist(), "attention_mask": mask.tolist(),
                                       "labels": labels.tolist()}).with_format("torch")
    args, trainer = make_trainer(tmp_path, model, fed_algorithm="fedgmt")
    algorithm = build_algorithm(args)
    space = trainer.space
    w0 = space.flatten()
    ema, dual = w0 + vector(w0.numel(), 1, 0.2), vector(w0.numel(), 2, 0.05)
    tau, beta = 3.0, 10.0

    def logits_at(w):
        return torch.func.functional_call(model, dict(zip(space.names, space.split(w))), args=(),
                                          kwargs={"input_ids": ids, "attention_mask": mask}).logits

    with torch.no_grad():
        teacher = torch.softmax(logits_at(ema) / tau, dim=1)

    def gradient(w, weight):
        w = w.detach().clone().requires_grad_(True)
        z = logits_at(w)
        kl = (teacher * (teacher.log() - torch.log_softmax(z / tau, dim=1))).sum(dim=1).mean()
        loss = nn.functional.cross_entropy(z, labels) + weight * tau ** 2 * kl
        return torch.autograd.grad(loss, w)[0] + weight * dual / beta

    def clip(g):
        return g * min(1.0, args.max_grad_norm / (float(g.norm()) + 1e-6))

    expected = w0 - 0.1 * clip(gradient(w0, 1.0))
    ctx = context(trainer, broadcast={"fedgmt": {"ema": ema}}, state={"fedgmt": {"dual": dual}})
    run_client(trainer, algorithm, data, ctx, steps=1)
    torch.testing.assert_close(space.flatten(), expected, rtol=0, atol=1e-6)
    assert (expected - (w0 - 0.1 * clip(gradient(w0, 0.0)))).abs().max() > 1e-3  # the terms matter here
