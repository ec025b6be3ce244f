"""The fast path (``hf_fedflat.runtime``) gives the plain Trainer path's numbers: reused optimizer and scratch
vectors, per-client seeding, the finite check, flat-vector buffers, heap trimming."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
from transformers import set_seed

from hf_fedflat import FederatedCallback, FedTrainingArguments, FederatedTrainer, runtime
from hf_fedflat.runtime.memory import HeapTrimmer, anonymous_resident_bytes, malloc_in_use_bytes, resident_set_bytes
from hf_fedflat.training import ParameterSpace
from hf_fedflat.training.parameters import all_finite

from conftest import TinyClassifier
from test_federated_run import TEST, TRAIN


class Trace(FederatedCallback):
    """Which optimizer object each client trained with (kept alive, so that ids are not reused)."""

    def __init__(self):
        self.optimizers = []

    def on_client_end(self, trainer, round_index, update, **kwargs):
        self.optimizers.append(trainer.client_trainer.optimizer)


def run(output_dir, *, reuse: bool, **overrides):
    """A federated run with the fast path on (``reuse``) or off (the plain Trainer path)."""
    settings = dict(
        output_dir=str(output_dir), use_cpu=True, num_clients=6, clients_per_round=3, num_rounds=4,
        per_device_train_batch_size=4, partition_scheme="iid", learning_rate=0.1, lr_decay_per_round=0.9, seed=7,
    )
    settings.update(overrides)
    args = FedTrainingArguments(**settings)
    torch.manual_seed(0)
    trace = Trace()
    with runtime.fast_path(reuse):
        trainer = FederatedTrainer(TinyClassifier(), args, TRAIN, TEST, label_column="labels", callbacks=[trace])
        return trainer, trainer.train(), trace


@pytest.mark.parametrize("algorithm, overrides", [
    # AdamW has per-parameter state: a reused optimizer must start each client from none, at the round's lr
    ("fedavg", dict(optim="adamw_torch", local_epochs=2.0)),
    # SAM + SCAFFOLD with gradient accumulation: saved w, earlier micro-batches, the correction
    ("fedgamma", dict(local_steps=2, gradient_accumulation_steps=2, rho=0.1)),
    # LESAM: the fixed offset added and w restored every step; w_old as client state
    ("fedlesam", dict(local_steps=3, rho=0.2)),
    # the client loop's stopping rules: a fractional epoch count, accumulation with a short last step
    ("scaffold", dict(local_epochs=1.5, gradient_accumulation_steps=3, max_grad_norm=0.5)),
    # max_steps past one epoch, no clipping, a linear schedule; the corrections applied to p.grad in place
    ("fedprox", dict(local_steps=7, max_grad_norm=0.0, lr_scheduler_type="linear")),
    ("fedup", dict(local_steps=3, fedup_alpha=0.5)),
    ("fedlesam_d", dict(local_steps=3, rho=0.2, feddyn_alpha=0.3)),
    ("fedlesam_s", dict(local_steps=3, rho=0.2)),
    # SAM's two passes with accumulation and clipping that always cuts (norm 0.05)
    ("fedsam", dict(local_steps=3, gradient_accumulation_steps=2, rho=0.1, max_grad_norm=0.05)),
])
def test_reused_trainer_equals_rebuilding_everything_per_client(tmp_path, algorithm, overrides):
    fast_trainer, fast, fast_trace = run(tmp_path / "fast", reuse=True, fed_algorithm=algorithm, **overrides)
    _, reference, reference_trace = run(tmp_path / "reference", reuse=False, fed_algorithm=algorithm, **overrides)
    torch.testing.assert_close(fast.params, reference.params, rtol=0, atol=0)
    assert [r["train_loss"] for r in fast.history] == [r["train_loss"] for r in reference.history]
    # the fast path was really taken: one optimizer for all 12 client rounds, and for corrections after a
    # single pass, the in-place correction of p.grad (the reference used flat vectors)
    assert len({id(o) for o in fast_trace.optimizers}) == 1
    assert len({id(o) for o in reference_trace.optimizers}) == 12
    in_place = fast_trainer.client_trainer.in_place_steps
    assert (in_place > 0) == (algorithm in ("scaffold", "fedprox", "fedup", "fedlesam", "fedlesam_d", "fedlesam_s"))
    assert [r["local_steps"] for r in fast.history] == [r["local_steps"] for r in reference.history]
    assert (fast.params - run(tmp_path / "other", reuse=True, fed_algorithm=algorithm, seed=8, **overrides)[1].params
            ).abs().max() > 1e-4  # a different seed changes the result: the comparison has teeth


def test_the_switch_reads_the_environment_and_is_per_thread():
    import threading

    from hf_fedflat.runtime import switch

    assert switch.parse(None) == switch.parse("1") == switch.ON and switch.ON.enabled
    assert switch.parse("0") == switch.OFF and not any(switch.OFF(m) for m in runtime.MECHANISMS)
    partial = switch.parse("-heap_trim, -select_rows")
    assert not partial("heap_trim") and not partial("select_rows") and partial("optimizer_reuse") and not partial.enabled
    with pytest.raises(ValueError, match="HF_FEDFLAT_FAST_PATH"):
        switch.parse("-no_such_mechanism")
    with pytest.raises(ValueError, match="unknown mechanisms"):
        with runtime.fast_path(without=["no_such_mechanism"]):
            pass
    before = runtime.current()
    seen = {}
    with runtime.fast_path(False):
        assert not runtime.enabled("optimizer_reuse")
        thread = threading.Thread(target=lambda: seen.update(other=runtime.current()))
        thread.start()
        thread.join()
        with runtime.fast_path(without=["heap_trim"]):
            assert runtime.enabled("optimizer_reuse") and not runtime.enabled("heap_trim")
        assert runtime.current() == switch.OFF
    assert seen["other"] == before and runtime.current() == before  # another thread keeps its own setting


def test_seed_for_client_gives_set_seed_generators(tmp_path):
    args = FedTrainingArguments(output_dir=str(tmp_path), use_cpu=True, num_clients=2, clients_per_round=2,
                                partition_scheme="iid")
    client = FederatedTrainer(TinyClassifier(), args, TRAIN, TEST, label_column="labels").client_trainer
    draws = []
    for seeding in (set_seed, client.seed_for_client):
        seeding(1234)
        draws.append((torch.rand(3).tolist(), np.random.rand(3).tolist(), random.random(), torch.randperm(9).tolist()))
    assert draws[0] == draws[1]
    if not torch.cuda.is_initialized():  # no CUDA seeding call queued per client
        queued = len(getattr(torch.cuda, "_queued_calls", []))
        for seed in range(20):
            client.seed_for_client(seed)
        assert len(getattr(torch.cuda, "_queued_calls", [])) == queued


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


def test_heap_trimmer_trims_only_past_its_slack():
    eager, lazy = HeapTrimmer(slack_bytes=-1, min_calls_between=1, check_every=1), HeapTrimmer(slack_bytes=2**50)
    if eager._malloc_trim is None:  # no glibc / no /proc: a no-op
        assert not eager.maybe_trim() and eager.trims == 0
        return
    assert eager.maybe_trim() and eager.trims == 1
    assert not lazy.maybe_trim() and lazy.trims == 0
    # freed model-sized buffers are returned: after a trim the resident set is not above its level before
    buffers = [torch.ones(2**18) for _ in range(64)]  # 64 MiB
    del buffers
    before = resident_set_bytes()
    eager.maybe_trim()
    assert resident_set_bytes() <= before
    # at most one trim per min_calls_between checks
    spaced = HeapTrimmer(slack_bytes=-1, min_calls_between=3, check_every=1)
    assert [spaced.maybe_trim() for _ in range(7)] == [True, False, False, True, False, False, True]
    # the resident set is read on the first and every check_every-th call only
    sparse = HeapTrimmer(slack_bytes=-1, min_calls_between=1, check_every=4)
    assert [sparse.maybe_trim() for _ in range(9)] == [True, False, False, False, True, False, False, False, True]


def test_heap_trimmer_does_not_trim_for_live_growth():
    """Memory a run holds (client states, caches) is not freed memory: growing by it must not set off trims."""
    trimmer = HeapTrimmer(slack_bytes=64 * 2**20, min_calls_between=1, check_every=1)
    before = resident_set_bytes()
    held = [torch.ones(2**16) for _ in range(800)]  # 200 MiB of 256 KiB tensors, all still referenced
    if trimmer._malloc_trim is None:  # no glibc / no /proc: a no-op
        assert not trimmer.maybe_trim()
        return
    if malloc_in_use_bytes() is None:  # glibc < 2.33 cannot say what is live: the resident set's growth decides
        assert trimmer.maybe_trim()
        return
    assert resident_set_bytes() - before > 150 * 2**20  # resident growth alone (the old rule) would trim here
    assert not trimmer.maybe_trim() and trimmer.trims == 0
    assert abs(HeapTrimmer.unused_resident_bytes() - trimmer._baseline) < 32 * 2**20
    del held


def test_heap_trimmer_reads_mallocs_statistics_only_past_the_resident_slack():
    """A check reads the resident set first; malloc's statistics (a walk of its free lists) only once the resident
    set grew by the slack, and after live growth the next slack counts from there."""
    if HeapTrimmer()._malloc_trim is None:  # no glibc / no /proc: a no-op
        trimmer = HeapTrimmer(slack_bytes=-1, check_every=1)
        assert not trimmer.maybe_trim() and trimmer.malloc_reads == 0
        return
    # the free heap that earlier tests left goes back to the OS first, so that the live tensors below take fresh
    # pages (malloc would serve them from its free heap, and the resident set would not grow)
    HeapTrimmer(slack_bytes=-1, check_every=1).maybe_trim()
    trimmer = HeapTrimmer(slack_bytes=64 * 2**20, min_calls_between=1, check_every=1)
    assert not any(trimmer.maybe_trim() for _ in range(5)) and trimmer.malloc_reads == 0
    before = anonymous_resident_bytes()
    held = [torch.ones(2**16) for _ in range(1024)]  # 256 MiB of live tensors
    assert anonymous_resident_bytes() - before > 200 * 2**20
    assert not trimmer.maybe_trim() and trimmer.malloc_reads == 1  # read, found live: no trim
    assert not trimmer.maybe_trim() and trimmer.malloc_reads == 1  # the slack counts from the live level now
    del held
    HeapTrimmer(slack_bytes=-1, check_every=1).maybe_trim()  # (no freed heap left behind for later tests)


@pytest.mark.parametrize("algorithm", ["scaffold", "fedlesam_d"])
def test_workspace_vectors_are_split_once_per_client_not_every_step(tmp_path, monkeypatch, algorithm):
    calls = []
    original = ParameterSpace.split
    monkeypatch.setattr(ParameterSpace, "split", lambda self, flat: calls.append(1) or original(self, flat))

    def splits(local_steps):
        calls.clear()
        trainer, _, _ = run(tmp_path / f"steps{local_steps}", reuse=True, fed_algorithm=algorithm,
                            local_steps=local_steps, rho=0.1)
        assert trainer.client_trainer.in_place_steps == 12 * local_steps
        return len(calls)

    assert splits(2) == splits(6)  # 4 more corrected steps per client, not one split more


def test_record_log_encodes_each_record_once_and_writes_the_whole_list(tmp_path, monkeypatch):
    import json

    import hf_fedflat.io as io

    encoded = []
    real = io._encode_record
    monkeypatch.setattr(io, "_encode_record", lambda record: encoded.append(record["round"]) or real(record))
    path = tmp_path / "history.json"
    log, history = io.RecordLog(path), []
    for round_index in range(4):
        history.append({"round": round_index, "loss": 1.0 / (round_index + 1), "clients": [1, 2], "path": tmp_path})
        log.write(history)
        assert json.loads(path.read_text()) == json.loads(json.dumps(history, default=str))
    assert encoded == [0, 1, 2, 3]  # each record once, not the whole list every round
    assert path.read_text().count("\n") == 4 + 2  # one record per line between the brackets
    resumed = history[:2]  # a resume replaces the list: it is encoded again from its start
    log.write(resumed)
    assert json.loads(path.read_text()) == json.loads(json.dumps(resumed, default=str)) and encoded[4:] == [0, 1]
    assert not list(tmp_path.glob(".history.json.*"))  # no temporary file left behind


def test_record_log_throttles_unforced_writes_and_flushes_what_is_pending(tmp_path, monkeypatch):
    import json

    import hf_fedflat.io as io

    clock = [100.0]
    monkeypatch.setattr(io.time, "monotonic", lambda: clock[0])
    path = tmp_path / "history.json"
    log, history = io.RecordLog(path, min_interval_seconds=1.0), [{"round": 1}]
    assert log.write(history, force=False)  # the first write is never held back
    history.append({"round": 2})
    clock[0] += 0.5
    assert not log.write(history, force=False) and len(json.loads(path.read_text())) == 1
    log.flush()
    assert len(json.loads(path.read_text())) == 2
    mtime = path.stat().st_mtime_ns
    log.flush()  # nothing pending: no rewrite
    assert path.stat().st_mtime_ns == mtime
    history.append({"round": 3})
    clock[0] += 0.4  # 0.9 s after the first write, but the flush wrote at 0.5: held back
    assert not log.write(history, force=False)
    assert log.write(history, force=True) and len(json.loads(path.read_text())) == 3
    history.append({"round": 4})
    clock[0] += 1.0
    assert log.write(history, force=False) and len(json.loads(path.read_text())) == 4
