"""MOON (``moon``): the model-contrastive loss on the representation against the paper's eq. (2), written out with
exponentials and computed by hand: on the tiny model (its representation is the input of its last layer,
``tanh(x W1^T + b1)``), on a transformers classifier (the pooled output) and on a timm model (the pre-logits
features, beside FedDecorr's loss)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from hf_fedflat import build_algorithm
from hf_fedflat.algorithms import LocalResult

from conftest import tiny_loss
from step_helpers import EPS, LR, context, descend, features, grad_of, make_trainer, run_client, setup, vector


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


# --- on a timm model: the pre-logits features ----------------------------------------------------------------
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
