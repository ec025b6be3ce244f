"""Causal LM evaluation: token-weighted loss, perplexity and next-token accuracy, without gathering logits.

A causal LM scores position ``t`` of ``labels`` with the logits at ``t - 1`` (the model's own shift); labels
``-100`` (the prompt of instruction data, padding) are not scored. Per evaluation batch,
:func:`token_statistics` (the Trainer's ``preprocess_logits_for_metrics``) reduces the ``[batch, length, vocab]``
logits to three numbers per row -- the summed negative log-likelihood of its scored tokens, their count and how
many the argmax predicts -- so only ``[rows, 3]`` is gathered across batches and processes, never the logits.
:func:`causal_lm_metrics` (the Trainer's ``compute_metrics``) sums them over the whole evaluation set:

* ``token_loss`` = sum NLL / scored tokens: the mean loss per token, every token weighted alike (the Trainer's
  own ``eval_loss`` is the mean of the per-batch means, which weighs a short batch's tokens more);
* ``perplexity`` = exp(``token_loss``);
* ``token_accuracy`` = tokens whose argmax is the label / scored tokens.

>>> trainer = Trainer(model, args, eval_dataset=ds, compute_metrics=causal_lm_metrics,
...                   preprocess_logits_for_metrics=token_statistics)
>>> trainer.evaluate()["eval_perplexity"]
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["IGNORE_INDEX", "causal_lm_metrics", "token_statistics"]

IGNORE_INDEX = -100


def token_statistics(logits: Any, labels: torch.Tensor) -> torch.Tensor:
    """``[batch, 3]`` float32: per row, the summed NLL of its scored next tokens, their count, and the argmax hits.

    Args:
        logits: ``[batch, length, vocab]`` (or a tuple whose first item is; past key values are ignored).
        labels: ``[batch, length]``, ``-100`` where a position is not scored. Position ``t`` is predicted from the
            logits at ``t - 1``.
    """
    if isinstance(logits, (tuple, list)):
        logits = logits[0]
    shifted = logits[:, :-1, :].float()
    target = labels[:, 1:].to(shifted.device)
    mask = target != IGNORE_INDEX
    safe = target.masked_fill(~mask, 0)
    nll = F.cross_entropy(shifted.reshape(-1, shifted.size(-1)), safe.reshape(-1), reduction="none")
    nll = nll.view_as(safe) * mask
    hits = (shifted.argmax(dim=-1) == safe) & mask
    return torch.stack([nll.sum(dim=1), mask.sum(dim=1).float(), hits.sum(dim=1).float()], dim=1)


def causal_lm_metrics(eval_prediction) -> dict[str, float]:
    """``token_loss``, ``perplexity``, ``token_accuracy`` and ``tokens`` over the evaluation set, from the rows of
    :func:`token_statistics` (the Trainer prefixes ``eval_``)."""
    stats = eval_prediction.predictions
    if isinstance(stats, tuple):
        stats = stats[0]
    stats = np.asarray(stats, dtype=np.float64).reshape(-1, 3)
    nll, tokens, hits = stats.sum(axis=0)
    if tokens <= 0:
        return {"token_loss": float("nan"), "perplexity": float("nan"), "token_accuracy": float("nan"), "tokens": 0.0}
    token_loss = float(nll / tokens)
    return {"token_loss": token_loss, "perplexity": float(math.exp(min(token_loss, 700.0))),
            "token_accuracy": float(hits / tokens), "tokens": float(tokens)}
