"""The seeds' other baselines (MOON, FedDecorr, FedCM, FedDC, FedSpeed) against their formulas, computed by hand.

As in test_algorithm_zoo.py the tiny model sees its whole 8-sample dataset as one batch, so every local step is
the full-data gradient of the method's objective at the current weights, computed here independently (autograd
of the objective written out, MOON's and FedDecorr's losses from their papers' formulas). The representation of
the tiny model is the input of its last layer, ``tanh(x W1^T + b1)``.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from hf_fedflat import build_algorithm
from hf_fedflat.algorithms import ClientUpdate, LocalResult
from hf_fedflat.algorithms.base import DELTA_SHIFT
from hf_fedflat.models.representation import pool, representation_module, RepresentationCapture

from conftest import TinyClassifier, tiny_loss
from step_helpers import LR, context, flat, make_trainer, run_client

EPS = 1e-12


def setup(tmp_path, model, data, **overrides):
    args, trainer = make_trainer(tmp_path, model, **overrides)
    x, y = data[:]["x"], data[:]["labels"]
    return args, trainer, build_algorithm(args), x, y, trainer.space.flatten()


def features(params, x):
    """The tiny model's representation at explicit parameters ``[W1, b1, W2, b2]``: ``tanh(x W1^T + b1)``."""
    return torch.tanh(x @ params[0].T + params[1])


def grad_of(objective, trainer, w):
    """Gradient of ``objective(params)`` at the flat weights ``w`` (independent of the training step)."""
    params = [p.detach().clone().requires_grad_(True) for p in trainer.space.split(w)]
    return flat(torch.autograd.grad(objective(params), params))


def descend(w0, steps, direction):
    w = w0.clone()
    for _ in range(steps):
        w = w - LR * direction(w)
    return w


def vector(dim, seed, scale=0.1):
    return scale * torch.randn(dim, generator=torch.Generator().manual_seed(seed))


def update(client_id, delta, messages=None, steps=2):
    return ClientUpdate(client_id, 8, steps, 0.0, delta, messages=messages or {})


# --- FedCM ------------------------------------------------------------------------------------------------
def test_fedcm_mixes_the_broadcast_global_update(tmp_path, tiny_model, tiny_data):
    args, trainer, algorithm, x, y, w0 = setup(tmp_path, tiny_model, tiny_data, fed_algorithm="fedcm")
    assert args.momentum_alpha == 0.1 and args.momentum_first_round == "zero_momentum"
    assert args.aggregation_weights == "uniform"
    a = 0.1
    m = vector(w0.numel(), 1)  # Delta^{t-1} = -(global change) / (K eta)
    g = lambda w: grad_of(lambda p: tiny_loss(tiny_model, p, x, y), trainer, w)  # noqa: E731
    expected = descend(w0, 2, lambda w: a * g(w) + (1 - a) * m)
    run_client(trainer, algorithm, tiny_data, context(trainer, broadcast={"momentum": {"m": m,
                                                                                       "ready": torch.ones(1)}}), 2)
    torch.testing.assert_close(trainer.space.flatten(), expected, rtol=0, atol=1e-6)

    # server: Delta^t = -(sum_i Delta_i / |S|) / (K eta), uniform over the two clients
    d1, d2 = vector(w0.numel(), 2), vector(w0.numel(), 3)
    state = algorithm.init_server_state(w0)
    _, state = algorithm.server_step(0, w0, [update(0, d1, steps=3), update(1, d2, steps=3)],
                                     torch.tensor([0.5, 0.5]), state, 2, learning_rate=LR)
    torch.testing.assert_close(state["momentum"]["m"], -(d1 + d2) / 2 / (3 * LR), rtol=0, atol=1e-7)


def test_fedcm_first_round_has_no_momentum(tmp_path, tiny_model, tiny_data):
    args, trainer, algorithm, x, y, w0 = setup(tmp_path, tiny_model, tiny_data, fed_algorithm="fedcm")
    g = lambda w: grad_of(lambda p: tiny_loss(tiny_model, p, x, y), trainer, w)  # noqa: E731
    expected = descend(w0, 2, lambda w: 0.1 * g(w))  # Delta^0 = 0
    broadcast = algorithm.broadcast(algorithm.init_server_state(w0))
    run_client(trainer, algorithm, tiny_data, context(trainer, broadcast=broadcast), 2)
    torch.testing.assert_close(trainer.space.flatten(), expected, rtol=0, atol=1e-6)


# --- FedDC ------------------------------------------------------------------------------------------------
def test_feddc_local_steps_drift_and_server(tmp_path, tiny_model, tiny_data):
    alpha = 0.3
    args, trainer, algorithm, x, y, w0 = setup(tmp_path, tiny_model, tiny_data, fed_algorithm="feddc",
                                               feddc_alpha=alpha)
    assert args.aggregation_weights == "uniform" and args.scaffold_server_average == "all_clients"  # paper and code
    assert algorithm.describe()["corrections"] == ["feddc", "scaffold"]
    dim = w0.numel()
    w_global = w0 + vector(dim, 1)
    h, c, c_i = vector(dim, 2), vector(dim, 3), vector(dim, 4)

    def objective(p, anchor):  # L_i(w) + alpha/2 ||w + h - w^t||^2 + <w, c - c_i>
        w = flat(p)
        return tiny_loss(tiny_model, p, x, y) + alpha / 2 * (w + h - anchor).pow(2).sum() + w @ (c - c_i)

    expected = descend(w0, 3, lambda w: grad_of(lambda p: objective(p, w_global), trainer, w))
    ctx = context(trainer, broadcast={"scaffold": {"c": c}}, state={"feddc": {"h": h}, "scaffold": {"c_i": c_i}})
    ctx.global_params = w_global
    workspaces = run_client(trainer, algorithm, tiny_data, ctx, steps=3)
    w_i = trainer.space.flatten()
    torch.testing.assert_close(w_i, expected, rtol=0, atol=1e-6)

    state, messages = algorithm.end_client(ctx, workspaces, LocalResult(w_i, 3, w_i - w_global))
    h_new = h + (w_i - w_global)  # h_i += w_i - w^t
    torch.testing.assert_close(state["feddc"]["h"], h_new, rtol=0, atol=1e-7)
    torch.testing.assert_close(messages["feddc"][DELTA_SHIFT], h_new, rtol=0, atol=1e-7)
    torch.testing.assert_close(state["scaffold"]["c_i"], c_i - c - (w_i - w_global) / (3 * LR), rtol=0, atol=1e-6)

    # server: w^{t+1} = mean_i (w_i + h_i) (sampled clients, equal weights); SCAFFOLD's c from the raw deltas
    d1, d2, h1, h2 = (vector(dim, s) for s in (5, 6, 7, 8))
    server_state = algorithm.init_server_state(w_global)
    new_w, server_state = algorithm.server_step(
        0, w_global, [update(0, d1, {"feddc": {DELTA_SHIFT: h1}}), update(1, d2, {"feddc": {DELTA_SHIFT: h2}})],
        torch.tensor([0.5, 0.5]), server_state, 4, learning_rate=LR)
    torch.testing.assert_close(new_w, ((w_global + d1 + h1) + (w_global + d2 + h2)) / 2, rtol=0, atol=1e-7)
    torch.testing.assert_close(server_state["scaffold"]["c"], -(d1 + d2) / (4 * 2 * LR), rtol=0, atol=1e-6)


# --- FedSpeed ---------------------------------------------------------------------------------------------
def test_fedspeed_merged_gradient_prox_correction_and_sent_model(tmp_path, tiny_model, tiny_data):
    rho, alpha, lam = 0.2, 0.4, 2.0
    args, trainer, algorithm, x, y, w0 = setup(tmp_path, tiny_model, tiny_data, fed_algorithm="fedspeed", rho=rho,
                                               fedspeed_alpha=alpha, fedspeed_lambda=lam)
    assert algorithm.passes_per_step == 2 and args.aggregation_weights == "uniform"
    dim = w0.numel()
    w_global = w0 + vector(dim, 1)
    g_hat = vector(dim, 2)
    g = lambda w: grad_of(lambda p: tiny_loss(tiny_model, p, x, y), trainer, w)  # noqa: E731

    def direction(w):  # Alg. 1 lines 5-9
        g1 = g(w)
        g2 = g(w + rho * g1 / (g1.norm() + EPS))
        return (1 - alpha) * g1 + alpha * g2 - g_hat + (w - w_global) / lam

    expected = descend(w0, 2, direction)
    ctx = context(trainer, state={"fedspeed": {"g_hat": g_hat}})
    ctx.global_params = w_global
    workspaces = run_client(trainer, algorithm, tiny_data, ctx, steps=2)
    w_i = trainer.space.flatten()
    torch.testing.assert_close(w_i, expected, rtol=0, atol=1e-6)
    assert trainer.gradient_passes == 4

    state, messages = algorithm.end_client(ctx, workspaces, LocalResult(w_i, 2, w_i - w_global))
    g_hat_new = g_hat - (w_i - w_global) / lam  # line 11
    torch.testing.assert_close(state["fedspeed"]["g_hat"], g_hat_new, rtol=0, atol=1e-7)
    x_hat = w_i - lam * g_hat_new  # line 12: what the client sends
    torch.testing.assert_close(w_global + (w_i - w_global) + messages["fedspeed"][DELTA_SHIFT], x_hat,
                               rtol=0, atol=1e-6)

    other = w_global + vector(dim, 3)  # a second client's x_hat
    new_w, _ = algorithm.server_step(
        0, w_global, [update(0, w_i - w_global, messages), update(1, other - w_global)],
        torch.tensor([0.5, 0.5]), algorithm.init_server_state(w_global), 2, learning_rate=LR)
    torch.testing.assert_close(new_w, (x_hat + other) / 2, rtol=0, atol=1e-6)  # line 14: mean of x_hat


# --- MOON -------------------------------------------------------------------------------------------------
def moon_term(z, z_glob, z_prev, tau):
    """MOON eq. (2) written out with exponentials, mean over the batch."""
    cos = lambda a, b: (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1))  # noqa: E731
    pos, neg = torch.exp(cos(z, z_glob) / tau), torch.exp(cos(z, z_prev) / tau)
    return (-torch.log(pos / (pos + neg))).mean()


@pytest.mark.parametrize("perturbation", [None, "lesam"])
def test_moon_contrastive_loss_on_the_representation(tmp_path, tiny_model, tiny_data, perturbation):
    mu, tau, rho = 2.0, 0.5, 0.3
    extra = {"perturbation": perturbation, "rho": rho} if perturbation else {}
    args, trainer, algorithm, x, y, w0 = setup(tmp_path, tiny_model, tiny_data, fed_algorithm="moon", moon_mu=mu,
                                               moon_temperature=tau, **extra)
    dim = w0.numel()
    w_global, w_prev = w0 + vector(dim, 1), w0 + vector(dim, 2, 0.5)
    split = trainer.space.split
    z_glob, z_prev = features(split(w_global), x), features(split(w_prev), x)

    def objective(p):
        return tiny_loss(tiny_model, p, x, y) + mu * moon_term(features(p, x), z_glob, z_prev, tau)

    state = {"moon": {"w_prev": w_prev}}
    offset = torch.zeros(dim)
    if perturbation:  # MOON + LESAM: the composite loss's gradient at w + e, e = rho (w_old - w^t)/||.||
        w_old = w_global + vector(dim, 3)
        state["lesam"] = {"w_old": w_old}
        offset = rho * (w_old - w_global) / ((w_old - w_global).norm() + EPS)
    expected = descend(w0, 2, lambda w: grad_of(objective, trainer, w + offset))
    ctx = context(trainer, state=state)
    ctx.global_params = w_global
    workspaces = run_client(trainer, algorithm, tiny_data, ctx, steps=2)
    w_i = trainer.space.flatten()
    torch.testing.assert_close(w_i, expected, rtol=0, atol=1e-6)
    plain = descend(w0, 2, lambda w: grad_of(lambda p: tiny_loss(tiny_model, p, x, y), trainer, w + offset))
    assert (w_i - plain).abs().max() > 1e-4  # the contrastive term changed the step: the check has teeth
    new_state, _ = algorithm.end_client(ctx, workspaces, LocalResult(w_i, 2, w_i - w_global))
    torch.testing.assert_close(new_state["moon"]["w_prev"], w_i, rtol=0, atol=1e-7)  # previous local model


def test_moon_first_round_is_erm(tmp_path, tiny_model, tiny_data):
    """No previous local model yet: z_prev = z_glob, l_con = log 2 with zero gradient."""
    args, trainer, algorithm, x, y, w0 = setup(tmp_path, tiny_model, tiny_data, fed_algorithm="moon", moon_mu=5.0)
    z = features(trainer.space.split(w0), x)
    assert abs(float(moon_term(z, z + 0.1, z + 0.1, 0.5)) - math.log(2)) < 1e-6
    expected = descend(w0, 2, lambda w: grad_of(lambda p: tiny_loss(tiny_model, p, x, y), trainer, w))
    run_client(trainer, algorithm, tiny_data, context(trainer), 2)
    torch.testing.assert_close(trainer.space.flatten(), expected, rtol=0, atol=1e-6)


def test_moon_with_fedgh_in_front(tmp_path, tiny_model, tiny_data):
    """moon x mean+fedgh: the harmonized mean of two conflicting updates, projected by hand."""
    args, trainer, algorithm, x, y, w0 = setup(tmp_path, tiny_model, tiny_data, fed_algorithm="moon",
                                               aggregator="mean+fedgh")
    assert algorithm.describe()["corrections"] == ["moon"] and algorithm.aggregator.name == "mean+fedgh"
    d1 = vector(w0.numel(), 4)
    d2 = -d1 + vector(w0.numel(), 5, 0.02)
    assert d1 @ d2 < 0
    g1 = d1 - (d1 @ d2) / (d2 @ d2) * d2
    g2 = d2 - (d2 @ d1) / (d1 @ d1) * d1
    new_w, _ = algorithm.server_step(0, w0, [update(0, d1), update(1, d2)], torch.tensor([0.5, 0.5]),
                                     algorithm.init_server_state(w0), 2, learning_rate=LR)
    torch.testing.assert_close(new_w, w0 + (g1 + g2) / 2, rtol=0, atol=1e-6)


# --- FedDecorr --------------------------------------------------------------------------------------------
def test_feddecorr_adds_the_decorrelation_loss(tmp_path, tiny_model, tiny_data):
    beta = 0.7
    args, trainer, algorithm, x, y, w0 = setup(tmp_path, tiny_model, tiny_data, fed_algorithm="feddecorr",
                                               feddecorr_beta=beta)

    def objective(p):
        z = features(p, x)
        d = z.shape[1]
        correlation = torch.corrcoef(z.T)  # Pearson correlation of the d dimensions over the batch
        return tiny_loss(tiny_model, p, x, y) + beta * correlation.pow(2).sum() / d ** 2

    expected = descend(w0, 2, lambda w: grad_of(objective, trainer, w))
    run_client(trainer, algorithm, tiny_data, context(trainer), 2)
    w_i = trainer.space.flatten()
    torch.testing.assert_close(w_i, expected, rtol=0, atol=1e-5)
    plain = descend(w0, 2, lambda w: grad_of(lambda p: tiny_loss(tiny_model, p, x, y), trainer, w))
    assert (w_i - plain).abs().max() > 1e-4


def test_feddecorr_with_a_sam_perturbation_runs_the_loss_at_both_points(tmp_path, tiny_model, tiny_data):
    beta, rho = 0.7, 0.2
    args, trainer, algorithm, x, y, w0 = setup(tmp_path, tiny_model, tiny_data, fed_algorithm="feddecorr",
                                               perturbation="sam", feddecorr_beta=beta, rho=rho)

    def objective(p):
        z = features(p, x)
        return tiny_loss(tiny_model, p, x, y) + beta * torch.corrcoef(z.T).pow(2).sum() / z.shape[1] ** 2

    def direction(w):
        g = grad_of(objective, trainer, w)
        return grad_of(objective, trainer, w + rho * g / (g.norm() + EPS))

    run_client(trainer, algorithm, tiny_data, context(trainer), 2)
    torch.testing.assert_close(trainer.space.flatten(), descend(w0, 2, direction), rtol=0, atol=1e-5)


# --- the representation hook --------------------------------------------------------------------------------
def capture(model, *args, mask=None, **kwargs):
    grab = RepresentationCapture(model)
    with grab.active():
        model(*args, **kwargs)
    return grab.take(mask)


def test_representation_of_a_timm_model_is_forward_head_pre_logits():
    import timm
    torch.manual_seed(0)
    model = timm.create_model("resnet10t", num_classes=3, pretrained=False).eval()
    x = torch.randn(2, 3, 32, 32)
    assert representation_module(model) is model.get_classifier()
    with torch.no_grad():
        want = model.forward_head(model.forward_features(x), pre_logits=True)
        torch.testing.assert_close(capture(model, x), want, rtol=0, atol=0)


def test_representation_of_hf_fedflat_image_classifier_reads_the_timm_head():
    from hf_fedflat.models import create_model

    model = create_model("resnet18_gn", num_classes=3, in_chans=3, image_size=32).eval()
    head = representation_module(model)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        z = capture(model, pixel_values=x)
        torch.testing.assert_close(head(z), model(pixel_values=x).logits, rtol=0, atol=1e-6)
    assert z.shape == (2, head.in_features)


def test_representation_of_transformers_classifiers():
    from transformers import BertConfig, BertForSequenceClassification, GPT2Config, GPT2ForSequenceClassification

    torch.manual_seed(0)
    ids = torch.randint(1, 50, (2, 5))
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    bert = BertForSequenceClassification(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                                    num_attention_heads=2, intermediate_size=32, num_labels=3)).eval()
    assert representation_module(bert) is bert.classifier
    with torch.no_grad():
        z = capture(bert, input_ids=ids, attention_mask=mask, mask=mask)
        torch.testing.assert_close(z, bert.bert(input_ids=ids, attention_mask=mask).pooler_output, rtol=0, atol=1e-6)

    gpt = GPT2ForSequenceClassification(GPT2Config(vocab_size=50, n_embd=16, n_layer=1, n_head=2, num_labels=3,
                                                   pad_token_id=0)).eval()
    assert representation_module(gpt) is gpt.score
    with torch.no_grad():
        z = capture(gpt, input_ids=ids, attention_mask=mask, mask=mask)
        hidden = gpt.transformer(input_ids=ids, attention_mask=mask).last_hidden_state
    want = torch.stack([hidden[0].mean(0), hidden[1, :3].mean(0)])  # mean over the attended tokens
    torch.testing.assert_close(z, want, rtol=0, atol=1e-6)


def test_representation_module_can_be_named_and_a_model_without_head_is_refused():
    model = nn.Sequential(nn.Conv2d(1, 2, 3))
    with pytest.raises(ValueError, match="representation_module"):
        representation_module(model)
    named = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    named.representation_module = "0"
    assert representation_module(named) is named[0]
    assert pool(torch.ones(2, 3, 4)).shape == (2, 4)


# --- MimeLite ---------------------------------------------------------------------------------------------
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


def test_mimelite_round_loop_computes_the_full_gradient_at_the_global_model(tmp_path):
    from test_federated_run import TRAIN, run

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


@pytest.mark.parametrize("algorithm", ["moon", "feddecorr", "fedcm", "feddc", "fedspeed", "mimelite", "moon+fedgh",
                                       "feddecorr+fedgh", "fedcm+fedgh", "feddc+fedgh", "fedspeed+fedgh",
                                       "mimelite+fedgh"])
def test_new_presets_train_end_to_end(tmp_path, algorithm):
    from test_federated_run import run

    trainer, output = run(tmp_path, fed_algorithm=algorithm, num_rounds=3, local_steps=3)
    assert torch.isfinite(output.params).all() and [r["round"] for r in output.history] == [1, 2, 3]
    assert output.history[-1]["train_loss"] < output.history[0]["train_loss"] * 1.5


def test_moon_on_a_transformers_classifier_uses_the_pooled_output(tmp_path):
    """One MOON step of a tiny BERT classifier = the hand-written objective with z = BERT's pooler output (the
    input of ``classifier``; dropout 0), its gradient clipped to ``max_grad_norm`` like every final direction."""
    import datasets
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(vocab_size=30, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16,
                        num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertForSequenceClassification(config)
    ids = torch.randint(1, 30, (4, 5))
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 0, 0, 0]])
    labels = torch.tensor([0, 1, 2, 1])
    data = datasets.Dataset.from_dict({"input_ids": ids.tolist(), "attention_mask": mask.tolist(),
                                       "labels": labels.tolist()}).with_format("torch")
    mu, tau = 3.0, 0.5
    args, trainer = make_trainer(tmp_path, model, fed_algorithm="moon", moon_mu=mu, moon_temperature=tau)
    algorithm = build_algorithm(args)
    space = trainer.space
    w0 = space.flatten()
    w_global, w_prev = w0 + vector(w0.numel(), 1, 0.05), w0 + vector(w0.numel(), 2, 0.3)
    batch = {"input_ids": ids, "attention_mask": mask}

    def logits_at(w):
        return torch.func.functional_call(model, dict(zip(space.names, space.split(w))), args=(), kwargs=batch).logits

    def z_at(w):  # BertModel's pooler output: tanh(W h_[CLS] + b)
        params = {n[len("bert."):]: t for n, t in zip(space.names, space.split(w)) if n.startswith("bert.")}
        return torch.func.functional_call(model.bert, params, args=(), kwargs=batch).pooler_output

    with torch.no_grad():
        z_glob, z_prev = z_at(w_global), z_at(w_prev)

    def gradient(w, weight):
        w = w.detach().clone().requires_grad_(True)
        loss = nn.functional.cross_entropy(logits_at(w), labels) + weight * moon_term(z_at(w), z_glob, z_prev, tau)
        return torch.autograd.grad(loss, w)[0]

    def clip(g):  # the Trainer clips the final direction to max_grad_norm (10)
        return g * min(1.0, args.max_grad_norm / (float(g.norm()) + 1e-6))

    g = gradient(w0, mu)
    assert args.max_grad_norm == 10.0 and g.norm() > args.max_grad_norm  # the clip is part of this step
    expected = w0 - LR * clip(g)
    ctx = context(trainer, state={"moon": {"w_prev": w_prev}})
    ctx.global_params = w_global
    run_client(trainer, algorithm, data, ctx, steps=1)
    torch.testing.assert_close(space.flatten(), expected, rtol=0, atol=1e-6)
    plain = w0 - LR * clip(gradient(w0, 0.0))
    assert (expected - plain).abs().max() > 1e-2  # the contrastive term matters here


def test_feddecorr_on_padded_text_batches_averages_the_attended_tokens(tmp_path):
    """GPT-2's ``score`` reads every token's hidden state: FedDecorr's z is their mean over the attended tokens.
    The batch comes from ``DataCollatorWithPadding`` (the collator of hf_fedflat's text datasets), which returns a
    ``BatchEncoding`` (a Mapping, not a dict): its attention mask must reach the representation."""
    import datasets
    from transformers import DataCollatorWithPadding, GPT2Config, GPT2ForSequenceClassification

    from hf_fixtures import CORPUS, train_word_tokenizer

    tokenizer = train_word_tokenizer("gpt")
    torch.manual_seed(0)
    model = GPT2ForSequenceClassification(GPT2Config(
        vocab_size=len(tokenizer), n_embd=8, n_layer=1, n_head=2, n_positions=16, num_labels=2,
        pad_token_id=tokenizer.pad_token_id, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    texts = CORPUS[:4]
    rows = [tokenizer(t)["input_ids"] for t in texts]
    assert len({len(r) for r in rows}) > 1  # padding happens
    labels = torch.tensor([0, 1, 0, 1])
    data = datasets.Dataset.from_dict({"input_ids": rows, "labels": labels.tolist()})
    beta = 5.0
    args, trainer = make_trainer(tmp_path, model, fed_algorithm="feddecorr", feddecorr_beta=beta)
    trainer.data_collator = DataCollatorWithPadding(tokenizer)
    algorithm = build_algorithm(args)
    space = trainer.space
    w0 = space.flatten()
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])

    def objective(w, weight):
        params = dict(zip(space.names, space.split(w)))
        out = torch.func.functional_call(model, params, args=(), kwargs={"input_ids": ids, "attention_mask": mask})
        hidden = torch.func.functional_call(
            model.transformer, {n[len("transformer."):]: t for n, t in params.items() if n.startswith("transformer.")},
            args=(), kwargs={"input_ids": ids, "attention_mask": mask}).last_hidden_state
        z = torch.stack([hidden[i, :len(r)].mean(0) for i, r in enumerate(rows)])  # the attended tokens only
        return nn.functional.cross_entropy(out.logits, labels) + weight * torch.corrcoef(z.T).pow(2).sum() / 8 ** 2

    def step(weight):
        w = w0.detach().clone().requires_grad_(True)
        g = torch.autograd.grad(objective(w, weight), w)[0]
        return w0 - LR * g * min(1.0, args.max_grad_norm / (float(g.norm()) + 1e-6))

    expected = step(beta)
    run_client(trainer, algorithm, data, context(trainer), steps=1)
    torch.testing.assert_close(space.flatten(), expected, rtol=0, atol=1e-6)
    assert (expected - step(0.0)).abs().max() > 1e-4  # the decorrelation term matters here


def tiny_timm_classifier():
    """hf_fedflat's image classifier around a 1-block timm ViT (no batch norm: eval and train forwards agree)."""
    from hf_fedflat.models import create_model

    torch.manual_seed(0)
    return create_model("vit_tiny_patch16_224", num_classes=3, in_chans=1, image_size=8, patch_size=4, depth=1,
                        embed_dim=8, num_heads=2)


def tiny_image_data():
    import datasets

    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 1, 8, 8, generator=g)
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    return datasets.Dataset.from_dict({"pixel_values": x.tolist(), "labels": y.tolist()}).with_format("torch"), x, y


def timm_features(model, space, w, x):
    """timm's own pre-logits features at the flat weights ``w``: ``forward_head(forward_features(x), pre_logits)``."""
    params = {n: t for n, t in zip(space.names, space.split(w)) if n.startswith("backbone.")}
    return torch.func.functional_call(_PreLogits(model.backbone), params, (x,))


class _PreLogits(nn.Module):
    def __init__(self, backbone):
        super().__init__()
        self.backbone = backbone

    def forward(self, x):
        return self.backbone.forward_head(self.backbone.forward_features(x), pre_logits=True)


def timm_logits(model, space, w, x):
    return torch.func.functional_call(model, dict(zip(space.names, space.split(w))), args=(),
                                      kwargs={"pixel_values": x}).logits


def test_feddecorr_and_moon_on_a_timm_model_read_the_pre_logits_features(tmp_path):
    """One FedDecorr step and one MOON step of a tiny timm ViT = the hand-written objectives with z = timm's
    ``forward_head(forward_features(x), pre_logits=True)`` (written with timm's own functions, not the hook)."""
    data, x, y = tiny_image_data()
    beta, mu, tau = 2.0, 2.0, 0.5
    for name, extra in (("feddecorr", {"feddecorr_beta": beta}), ("moon", {"moon_mu": mu, "moon_temperature": tau})):
        model = tiny_timm_classifier()
        args, trainer = make_trainer(tmp_path / name, model, fed_algorithm=name, **extra)
        space = trainer.space
        w0 = space.flatten()
        w_global, w_prev = w0 + vector(w0.numel(), 1, 0.05), w0 + vector(w0.numel(), 2, 0.3)
        with torch.no_grad():
            z_glob, z_prev = timm_features(model, space, w_global, x), timm_features(model, space, w_prev, x)

        def term(z):
            if name == "feddecorr":  # ||K||_F^2 / d^2, K the correlations (population variances + 1e-8)
                cov = torch.cov(z.T, correction=0)
                var = torch.diagonal(cov) + 1e-8
                return beta * (cov.pow(2) / (var[:, None] * var[None, :])).sum() / z.shape[1] ** 2
            return mu * moon_term(z, z_glob, z_prev, tau)

        def step(with_term):
            w = w0.detach().clone().requires_grad_(True)
            loss = nn.functional.cross_entropy(timm_logits(model, space, w, x), y)
            if with_term:
                loss = loss + term(timm_features(model, space, w, x))
            g = torch.autograd.grad(loss, w)[0]
            return w0 - LR * g * min(1.0, args.max_grad_norm / (float(g.norm()) + 1e-6))

        expected = step(True)
        ctx = context(trainer, state={"moon": {"w_prev": w_prev}})
        ctx.global_params = w_global
        run_client(trainer, build_algorithm(args), data, ctx, steps=1)
        torch.testing.assert_close(space.flatten(), expected, rtol=0, atol=1e-5, msg=name)
        assert (expected - step(False)).abs().max() > 1e-3, name  # the term matters here


# --- with a perturbation in front: the corrections add their terms to the perturbed gradient --------------------
def test_feddc_with_sam_adds_the_drift_and_scaffold_terms_to_the_sam_gradient(tmp_path, tiny_model, tiny_data):
    alpha, rho = 0.3, 0.2
    args, trainer, algorithm, x, y, w0 = setup(tmp_path, tiny_model, tiny_data, fed_algorithm="feddc",
                                               perturbation="sam", rho=rho, feddc_alpha=alpha)
    assert algorithm.describe()["perturbation"] == "sam" and algorithm.passes_per_step == 2
    dim = w0.numel()
    w_global = w0 + vector(dim, 1)
    h, c, c_i = vector(dim, 2), vector(dim, 3), vector(dim, 4)
    g = lambda w: grad_of(lambda p: tiny_loss(tiny_model, p, x, y), trainer, w)  # noqa: E731

    def direction(w):  # SAM's g(w + rho g/||g||), then alpha (w + h_i - w^t) + (c - c_i)
        g1 = g(w)
        return g(w + rho * g1 / (g1.norm() + EPS)) + alpha * (w + h - w_global) + (c - c_i)

    ctx = context(trainer, broadcast={"scaffold": {"c": c}}, state={"feddc": {"h": h}, "scaffold": {"c_i": c_i}})
    ctx.global_params = w_global
    run_client(trainer, algorithm, tiny_data, ctx, steps=3)
    torch.testing.assert_close(trainer.space.flatten(), descend(w0, 3, direction), rtol=0, atol=1e-6)


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


def test_fedcm_with_lesam_mixes_the_momentum_into_the_lesam_gradient(tmp_path, tiny_model, tiny_data):
    a, rho = 0.1, 0.3
    args, trainer, algorithm, x, y, w0 = setup(tmp_path, tiny_model, tiny_data, fed_algorithm="fedcm",
                                               perturbation="lesam", rho=rho)
    dim = w0.numel()
    m, w_old = vector(dim, 1), w0 + vector(dim, 2)
    e = rho * (w_old - w0) / ((w_old - w0).norm() + EPS)
    g = lambda w: grad_of(lambda p: tiny_loss(tiny_model, p, x, y), trainer, w)  # noqa: E731
    ctx = context(trainer, broadcast={"momentum": {"m": m, "ready": torch.ones(1)}}, state={"lesam": {"w_old": w_old}})
    run_client(trainer, algorithm, tiny_data, ctx, 2)
    torch.testing.assert_close(trainer.space.flatten(), descend(w0, 2, lambda w: a * g(w + e) + (1 - a) * m),
                               rtol=0, atol=1e-6)


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


def test_feddc_with_fedgh_harmonizes_the_deltas_then_adds_the_drifts(tmp_path, tiny_model, tiny_data):
    """feddc+fedgh: w^{t+1} = w^t + mean_i (Delta~_i + h_i), Delta~ the FedGH projections of conflicting deltas; SCAFFOLD's
    c still follows the clients' own deltas."""
    args, trainer, algorithm, x, y, w0 = setup(tmp_path, tiny_model, tiny_data, fed_algorithm="feddc+fedgh")
    assert algorithm.aggregator.name == "shifted_mean+fedgh"
    dim = w0.numel()
    d1 = vector(dim, 4)
    d2 = -d1 + vector(dim, 5, 0.02)
    h1, h2 = vector(dim, 6), vector(dim, 7)
    assert d1 @ d2 < 0
    g1 = d1 - (d1 @ d2) / (d2 @ d2) * d2
    g2 = d2 - (d2 @ d1) / (d1 @ d1) * d1
    new_w, state = algorithm.server_step(
        0, w0, [update(0, d1, {"feddc": {DELTA_SHIFT: h1}}), update(1, d2, {"feddc": {DELTA_SHIFT: h2}})],
        torch.tensor([0.5, 0.5]), algorithm.init_server_state(w0), 4, learning_rate=LR)
    torch.testing.assert_close(new_w, w0 + (g1 + h1 + g2 + h2) / 2, rtol=0, atol=1e-6)
    torch.testing.assert_close(state["scaffold"]["c"], -(d1 + d2) / (4 * 2 * LR), rtol=0, atol=1e-6)


# --- MimeLite over two rounds of the real round loop ----------------------------------------------------------
def test_mimelite_two_rounds_match_the_hand_formula(tmp_path):
    """Two rounds, two clients, full-batch local steps: round r starts from w^r with the server momentum m^r
    (m^0 = 0); each client sends grad f_i(w^r) over all its rows and steps K times with (1-beta) g + beta m^r at
    lr_r; the server averages the weights uniformly and sets m^{r+1} = (1-beta) mean_i grad f_i(w^r) + beta m^r."""
    from test_federated_run import TRAIN, run

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


def test_feddecorr_code_normalization_is_the_authors_loss(tmp_path, tiny_model, tiny_data):
    """``--feddecorr_normalization code``: mean over j != k of ((Z^T Z)_jk)^2 / N, Z standardized with the unbiased
    variance (+1e-8), written here through the unbiased covariance: (Z^T Z)_jk = (N-1) cov_jk / sqrt(v_j v_k)."""
    beta = 0.7
    args, trainer, algorithm, x, y, w0 = setup(tmp_path, tiny_model, tiny_data, fed_algorithm="feddecorr",
                                               feddecorr_beta=beta, feddecorr_normalization="code")

    def decorr(z):
        n, d = z.shape
        cov = torch.cov(z.T, correction=1)
        var = torch.diagonal(cov) + 1e-8
        gram_sq = ((n - 1) * cov).pow(2) / (var[:, None] * var[None, :])
        return (gram_sq.sum() - torch.diagonal(gram_sq).sum()) / (d * (d - 1)) / n

    def objective(p):
        return tiny_loss(tiny_model, p, x, y) + beta * decorr(features(p, x))

    run_client(trainer, algorithm, tiny_data, context(trainer), 2)
    w_i = trainer.space.flatten()
    torch.testing.assert_close(w_i, descend(w0, 2, lambda w: grad_of(objective, trainer, w)), rtol=0, atol=1e-5)
    z = features(trainer.space.split(w0), x)  # about N (= 8) times the paper's loss, off the constant diagonal
    n, d = z.shape
    paper_off_diagonal = (torch.corrcoef(z.T).pow(2).sum() - d) / d ** 2
    ratio = float(decorr(z) / paper_off_diagonal)
    assert ratio == pytest.approx((n - 1) ** 2 * d / (n * (d - 1)), rel=1e-3)
    from hf_fedflat.corrections.feddecorr import FedDecorrConfig

    with pytest.raises(ValueError, match="feddecorr_normalization"):
        FedDecorrConfig(feddecorr_normalization="barlow").validate()
