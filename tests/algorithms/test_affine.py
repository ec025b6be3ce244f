"""Affine expressions (``algorithms.affine``): a correction's formula keeps its written terms and order, and its two
evaluations (on flat vectors and on ``p.grad`` in place) agree."""

from __future__ import annotations

import pytest
import torch

from hf_fedflat.algorithms import D, W
from hf_fedflat.algorithms.affine import evaluate, evaluate_, symbol


def test_affine_expressions_keep_the_written_terms_and_order():
    v, u = torch.arange(4.0), torch.ones(4)
    expression = 0.5 * D + 2.0 * W - 3.0 * symbol(v) + symbol(u) / 4
    assert expression.scale == 0.5 and [c for c, _ in expression.terms] == [2.0, -3.0, 0.25]
    assert expression.reads_weights and (D - 1.0 * symbol(v)).scale == 1.0
    d, w = torch.full((4,), 2.0), torch.full((4,), -1.0)
    expected = 0.5 * d + 0.1 * (2.0 * w - 3.0 * v + 0.25 * u)
    torch.testing.assert_close(evaluate(expression, d, lambda: w, 0.1), expected)
    grads = [d.clone()]
    evaluate_(expression, grads, [w], lambda flat_vector: [flat_vector], 0.1)
    assert torch.equal(grads[0], evaluate(expression, d, lambda: w, 0.1))
    assert evaluate(D, d, lambda: w) is d
    with pytest.raises(TypeError):
        D + torch.ones(4)  # a raw tensor is not a symbol: the formula must say what it adds
    with pytest.raises(TypeError):
        W * W  # not affine
