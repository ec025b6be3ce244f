"""Tensors in a Flower message: exact for every dtype; a layout that does not fit its bytes is refused."""

from __future__ import annotations

import json

import pytest
import torch

from hf_fedflat.flower.packing import pack, unpack


def test_every_dtype_round_trips_bit_for_bit():
    tensors = {"a": torch.randn(5, 3), "b": torch.randn(7, dtype=torch.float64), "c": torch.randn(4).bfloat16(),
               "d": torch.tensor([3, -1], dtype=torch.int64), "e": torch.zeros(0), "f": torch.tensor(2.5)}
    array, layout = pack(tensors)
    got = unpack(array.copy(), layout)
    assert list(got) == list(tensors)
    for name, tensor in tensors.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape
        assert torch.equal(got[name], tensor)


@pytest.mark.parametrize("change, message", [
    (lambda meta: {**meta, "nbytes": meta["nbytes"] + 8}, "the layout describes"),
    (lambda meta: {**meta, "entries": [["a", "no_such_dtype", [2], 0, 8]]}, "entry 'a'"),
    (lambda meta: {**meta, "entries": [["a", "float32", [64], 0, 256]]}, "entry 'a'"),
])
def test_a_layout_that_does_not_fit_is_refused(change, message):
    array, layout = pack({"a": torch.ones(2)})
    with pytest.raises(ValueError, match=message):
        unpack(array, json.dumps(change(json.loads(layout))))
