"""Causal LM metrics (``hf_fedflat.metrics.language_modeling``): token statistics on a hand-made padded batch, and
perplexity against an independent per-token computation through ``Trainer.evaluate``."""

from __future__ import annotations

import math

import datasets
import numpy as np
import pytest
import torch
from transformers import EvalPrediction

from hf_fedflat.data.tiny_text import train_word_tokenizer
from hf_fedflat.metrics.language_modeling import causal_lm_metrics, token_statistics


def test_token_statistics_on_a_hand_made_padded_batch():
    # vocabulary of 3; row 0 has 4 positions, row 1 is padded after 2 (labels -100), and its first label is -100
    logits = torch.tensor([
        [[2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 3.0], [9.0, 9.0, 9.0]],
        [[0.0, 2.0, 0.0], [1.0, 1.0, 1.0], [5.0, 0.0, 0.0], [0.0, 5.0, 0.0]],
    ])
    labels = torch.tensor([[-100, 0, 1, 2], [-100, 1, -100, -100]])
    stats = token_statistics(logits, labels)
    # row 0 scores labels 0, 1, 2 at positions 1..3 with the logits of positions 0..2
    lse = lambda *z: math.log(sum(math.exp(v) for v in z))  # noqa: E731
    nll0 = (lse(2, 0, 0) - 2) + (lse(0, 1, 0) - 1) + (lse(0, 0, 3) - 3)
    hits0 = 3  # argmaxes 0, 1, 2 are the labels 0, 1, 2
    # row 1 scores only label 1 at position 1, from the logits of position 0 ([0, 2, 0]: argmax 1, a hit)
    nll1 = lse(0, 2, 0) - 2
    np.testing.assert_allclose(stats.numpy(), [[nll0, 3, hits0], [nll1, 1, 1]], rtol=1e-6)
    # a miss: the same row 1 with label 0 instead
    miss = token_statistics(logits[1:], torch.tensor([[-100, 0, -100, -100]]))
    np.testing.assert_allclose(miss.numpy(), [[lse(0, 2, 0) - 0, 1, 0]], rtol=1e-6)
    # tuple outputs (logits, past key values) use the logits
    assert torch.equal(token_statistics((logits, "past"), labels), stats)
    metrics = causal_lm_metrics(EvalPrediction(predictions=stats.numpy(), label_ids=labels.numpy()))
    mean = (nll0 + nll1) / 4  # token-weighted: 4 scored tokens, not the mean of the two rows' means
    assert metrics["token_loss"] == pytest.approx(mean, rel=1e-6)
    assert metrics["perplexity"] == pytest.approx(math.exp(mean), rel=1e-6)
    assert metrics["token_accuracy"] == pytest.approx(4 / 4) and metrics["tokens"] == 4
    assert (nll0 / 3 + nll1) / 2 != pytest.approx(mean, rel=1e-3)  # the row-mean would differ here


def test_perplexity_through_trainer_evaluate_equals_exp_of_independent_token_mean(tmp_path):
    from transformers import DataCollatorForSeq2Seq, GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    tokenizer = train_word_tokenizer("gpt")
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=2, n_positions=64,
                                       pad_token_id=tokenizer.pad_token_id)).eval()
    g = torch.Generator().manual_seed(1)
    rows = []
    for length in (3, 7, 5, 9, 4):  # uneven lengths, batches of 2: the Trainer's eval_loss is a mean of batch means
        ids = torch.randint(3, len(tokenizer), (length,), generator=g).tolist()
        labels = [-100] * (length // 2) + ids[length // 2:]
        rows.append({"input_ids": ids, "attention_mask": [1] * length, "labels": labels})
    data = datasets.Dataset.from_list(rows)
    args = TrainingArguments(str(tmp_path), per_device_eval_batch_size=2, report_to="none", use_cpu=True)
    trainer = Trainer(model=model, args=args, eval_dataset=data, compute_metrics=causal_lm_metrics,
                      preprocess_logits_for_metrics=token_statistics,
                      data_collator=DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=-100))
    metrics = trainer.evaluate()
    nll, count = 0.0, 0
    with torch.no_grad():
        for row in rows:  # one row at a time, no padding, float64 log-softmax
            logp = torch.log_softmax(model(input_ids=torch.tensor([row["input_ids"]])).logits[0].double(), -1)
            for t, label in enumerate(row["labels"]):
                if t > 0 and label != -100:
                    nll -= float(logp[t - 1, label])
                    count += 1
    assert metrics["eval_tokens"] == count
    assert metrics["eval_token_loss"] == pytest.approx(nll / count, rel=1e-5)
    assert metrics["eval_perplexity"] == pytest.approx(math.exp(nll / count), rel=1e-5)
    assert metrics["eval_loss"] != pytest.approx(nll / count, rel=1e-4)  # batch means, not token-weighted
