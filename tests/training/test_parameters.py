"""The parameter space (``training.parameters``): ``all_finite`` is exactly ``isfinite``, ``out=`` buffers equal
fresh vectors, differences are read lazily, and shifted parameters give the gradient at ``w + offset`` and ``w``
back exactly."""

from __future__ import annotations

import math

import pytest
import torch

from hf_fedflat.training import ParameterSpace
from hf_fedflat.training.parameters import all_finite

from conftest import TinyClassifier


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_all_finite_is_exactly_isfinite(dtype):
    g = torch.Generator().manual_seed(0)
    for bad in (math.nan, math.inf, -math.inf):
        for position in (0, 17, 999):
            t = torch.randn(1000, generator=g).to(dtype)
            assert all_finite(t)
            t[position] = bad
            assert not all_finite(t) and not all_finite([torch.ones(3), t])
    huge = torch.full((10,), torch.finfo(dtype).max, dtype=dtype)  # finite, but the sum overflows
    assert all_finite(huge) and bool(torch.isfinite(huge).all()) and not bool(torch.isfinite(huge.sum()))
    assert all_finite([torch.arange(5), torch.empty(0, dtype=dtype), torch.zeros(2, 3, dtype=dtype)])


def test_all_finite_reads_complex_sums():
    t = torch.randn(50, dtype=torch.complex64)
    assert all_finite(t)
    for bad in (complex(math.nan, 0), complex(0, math.inf), complex(-math.inf, 1)):
        u = t.clone()
        u[7] = bad
        assert not all_finite(u)


def test_parameter_space_out_buffers_equal_fresh_vectors():
    torch.manual_seed(0)
    model = TinyClassifier()
    space = ParameterSpace(model)
    model(torch.randn(4, 4), labels=torch.tensor([0, 1, 2, 0]))["loss"].backward()
    model.net[0].bias.grad = None  # a parameter without gradient counts as zeros
    out = torch.full((space.numel,), 7.0)
    assert space.flatten(out=out) is out and torch.equal(out, space.flatten())
    grad = torch.full((space.numel,), 7.0)
    assert space.grad(out=grad) is grad and torch.equal(grad, space.grad())
    assert torch.equal(space.split(grad)[1], torch.zeros(5))


def test_difference_from_the_parameters_equals_flatten_minus_reference_and_params_are_read_lazily():
    from hf_fedflat.algorithms import LocalResult

    torch.manual_seed(0)
    space = ParameterSpace(TinyClassifier())
    reference = space.flatten() + torch.randn(space.numel)
    out = torch.full((space.numel,), 7.0)
    assert space.difference(reference, out=out) is out
    assert torch.equal(out, space.flatten() - reference) and torch.equal(space.difference(reference), out)
    reads = []
    result = LocalResult(lambda: reads.append(1) or space.flatten(), 3, out)
    assert not reads and result.num_steps == 3 and result.delta is out
    assert torch.equal(result.params, space.flatten()) and torch.equal(result.params, space.flatten()) and reads == [1]
    assert LocalResult(reference, 1, out).params is reference


def test_shifted_parameters_give_the_gradient_at_w_plus_offset_and_w_back_exactly():
    torch.manual_seed(0)
    model, reference = TinyClassifier(), TinyClassifier()
    space, reference_space = ParameterSpace(model), ParameterSpace(reference)
    x, y = torch.randn(4, 4), torch.tensor([0, 1, 2, 0])
    w = space.flatten()
    storages = [p.data_ptr() for p in space.params]
    offset = torch.randn(space.numel) * 0.3
    # the reference: a second model whose weights are w + offset (the same addition)
    reference_space.load_(torch.add(w, offset))
    reference(x, labels=y)["loss"].backward()
    out = torch.full((space.numel,), 7.0)
    with space.shifted(offset, out_views=space.split(out)):
        assert torch.equal(space.flatten(), torch.add(w, offset)) and torch.equal(out, torch.add(w, offset))
        model(x, labels=y)["loss"].backward()
    assert torch.equal(space.flatten(), w)  # bit for bit, in the parameters' own storage
    assert [p.data_ptr() for p in space.params] == storages
    assert torch.equal(space.grad(), reference_space.grad())
    # restored when the pass raises, too
    with pytest.raises(RuntimeError, match="boom"):
        with space.shifted(offset):
            raise RuntimeError("boom")
    assert torch.equal(space.flatten(), w) and [p.data_ptr() for p in space.params] == storages
