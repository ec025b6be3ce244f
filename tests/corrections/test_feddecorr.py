"""FedDecorr (``feddecorr``): the decorrelation loss on the representation, computed by hand from the paper's
formula (docs/algorithms.md) and from the authors' code (``--feddecorr_normalization code``): on the tiny model
(its representation is the input of its last layer, ``tanh(x W1^T + b1)``), with a SAM perturbation, and on padded
text batches. (On a timm model, beside MOON: ``tests/corrections/test_moon.py``.)"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hf_fedflat import build_algorithm

from conftest import tiny_loss
from step_helpers import EPS, LR, context, descend, features, grad_of, make_trainer, run_client, setup


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


def test_feddecorr_on_padded_text_batches_averages_the_attended_tokens(tmp_path):
    """GPT-2's ``score`` reads every token's hidden state: FedDecorr's z is their mean over the attended tokens.
    The batch comes from ``DataCollatorWithPadding`` (the collator of hf_fedflat's text datasets), which returns a
    ``BatchEncoding`` (a Mapping, not a dict): its attention mask must reach the representation."""
    import datasets
    from transformers import DataCollatorWithPadding, GPT2Config, GPT2ForSequenceClassification

    from helpers.hf_fixtures import CORPUS, train_word_tokenizer

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
