"""The byte packing behind the cross-process exchange is exact for every dtype and shape."""

import torch

from hf_fedflat.federation.comm import pack_tensors, unpack_tensors


def test_pack_unpack_round_trip_is_exact():
    tensors = {
        "delta": torch.randn(7, dtype=torch.float32),
        "odd": torch.arange(3, dtype=torch.uint8),  # 3 bytes: the next entry must still be aligned
        "matrix": torch.randn(2, 3, dtype=torch.float64),
        "step": torch.tensor(5, dtype=torch.int64),
        "half": torch.randn(5).to(torch.bfloat16),
        "empty": torch.zeros(0),
        "flag": torch.tensor([True, False]),
    }
    meta, buffer = pack_tensors(tensors)
    assert buffer.dtype == torch.uint8 and buffer.numel() == meta["nbytes"]
    out = unpack_tensors(meta, buffer.clone())
    assert list(out) == list(tensors)
    for name, tensor in tensors.items():
        assert out[name].dtype == tensor.dtype and out[name].shape == tensor.shape
        assert torch.equal(out[name], tensor), name
