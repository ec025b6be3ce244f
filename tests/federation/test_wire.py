"""The byte packing behind the cross-process exchange (layout planned, then written into a given, possibly
reused buffer) is exact for every dtype and shape."""

import torch

from hf_fedflat.federation.wire import plan_tensors, unpack_tensors, write_tensors


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
    plan = plan_tensors(tensors)
    meta = plan[0]
    buffer = write_tensors(plan, torch.full((meta["nbytes"],), 0xAB, dtype=torch.uint8))  # stale bytes
    assert buffer.dtype == torch.uint8 and buffer.numel() == meta["nbytes"]
    # the alignment gaps are zeroed: a reused buffer's stale bytes do not leak into the message
    ends = [offset + size for _, _, _, offset, size in meta["entries"]]
    starts = [offset for _, _, _, offset, _ in meta["entries"]][1:] + [meta["nbytes"]]
    assert all(not buffer[end:start].any() for end, start in zip(ends, starts)) and ends[1] < starts[1]
    out = unpack_tensors(meta, buffer.clone())
    assert list(out) == list(tensors)
    for name, tensor in tensors.items():
        assert out[name].dtype == tensor.dtype and out[name].shape == tensor.shape
        assert torch.equal(out[name], tensor), name
