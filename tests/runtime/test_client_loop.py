"""The lean client loop (``hf_fedflat.runtime.client_loop``, mechanism ``client_loop``) gives the Trainer's loop's
numbers: the same batches and random draws, the same weights and losses, bit for bit; it steps aside where the
Trainer's loop would do more."""

from __future__ import annotations

import math
import tempfile
from types import SimpleNamespace

import pytest
import torch
from accelerate.utils import DistributedType
from transformers import TrainerCallback

from hf_fedflat import FederatedCallback, FederatedTrainer, FedTrainingArguments, create_trainer, runtime
from hf_fedflat.runtime import client_loop
from hf_fedflat.runtime.materialize import TensorRows

from helpers.random_draws import DropoutClassifier, noisy_train_data
from helpers.runs import TEST, TRAIN


def settings(tmp, **overrides) -> dict:
    values = dict(output_dir=tmp, use_cpu=True, num_clients=6, clients_per_round=3, num_rounds=4,
                  per_device_train_batch_size=4, partition_scheme="iid", learning_rate=0.1, seed=7,
                  remove_unused_columns=False)
    values.update(overrides)
    return values


def client_trainer_for(tmp, train=TRAIN, **overrides):
    trainer = FederatedTrainer(DropoutClassifier(), FedTrainingArguments(**settings(tmp, **overrides)), train, TEST,
                               label_column="labels")
    return trainer.local_training, trainer.client_trainer


@pytest.mark.parametrize("batch_size, drop_last", [(4, False), (5, False), (5, True), (32, False)])
def test_tensor_rows_loader_gives_the_trainers_batches_and_random_draws(batch_size, drop_last):
    with tempfile.TemporaryDirectory() as tmp:
        local, trainer = client_trainer_for(tmp, per_device_train_batch_size=batch_size,
                                            dataloader_drop_last=drop_last)
        rows = local.client_dataset(2)
        assert type(rows) is TensorRows  # the torch-format data were materialised
        trainer.train_dataset = rows
        epochs = []
        staged = lambda: client_loop.TensorRowsLoader(rows, batch_size, drop_last, trainer.args.device,  # noqa: E731
                                                      stage_on_device=True)  # (a GPU's path, run on the CPU)
        for lean, build in enumerate((trainer.get_train_dataloader,
                                      lambda: client_loop.tensor_rows_loader(trainer, trainer.args), staged)):
            torch.manual_seed(1234)
            loader = build()
            assert isinstance(loader, client_loop.TensorRowsLoader) == bool(lean)
            seen = []
            for epoch in range(3):
                loader.set_epoch(epoch)
                batches = [{k: v.clone() for k, v in batch.items()} for batch in loader]
                seen.append((len(loader), batches, torch.get_rng_state().clone()))  # the generator after the epoch
            epochs.append(seen)
        for lean_epochs in epochs[1:]:
            for (n_real, real, state_real), (n_lean, lean, state_lean) in zip(epochs[0], lean_epochs):
                assert n_real == n_lean == len(real) == len(lean) and len(real) >= 1
                for a, b in zip(real, lean):
                    assert list(a) == list(b) and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)
                assert torch.equal(state_real, state_lean)
        # the epochs differ (reshuffled), so equal orders are not an accident of one order
        assert any(not torch.equal(a["labels"], b["labels"]) for a, b in zip(epochs[0][0][1], epochs[0][1][1]))


def run(tmp, train, model_class=DropoutClassifier, callbacks=None, **overrides):
    torch.manual_seed(0)
    trainer = create_trainer(model_class(), FedTrainingArguments(**settings(tmp, **overrides)), train, TEST,
                             label_column="labels", callbacks=callbacks)
    output = trainer.train()
    return output, trainer.client_trainer.lean_loop_clients


@pytest.mark.parametrize("algorithm, overrides", [
    # dropout draws after the loader's draw, a fractional epoch count, accumulation with a short last step
    ("fedavg", dict(local_epochs=1.5, gradient_accumulation_steps=3, max_grad_norm=0.5)),
    # max_steps past one epoch, drop_last, AdamW with a linear schedule, no clipping
    ("fedavg", dict(local_steps=7, dataloader_drop_last=True, optim="adamw_torch", lr_scheduler_type="linear",
                    max_grad_norm=0.0)),
    # two passes per step with accumulation; a correction added to p.grad in place
    ("fedsam", dict(local_steps=3, gradient_accumulation_steps=2, rho=0.1, max_grad_norm=0.05)),
    ("scaffold", dict(local_steps=4)),
    ("fedlesam", dict(local_steps=3, rho=0.2)),
    # label smoothing: compute_loss pops the labels from its inputs, and SAM's second pass reuses the batch
    ("fedsam", dict(local_steps=2, rho=0.1, label_smoothing_factor=0.1, model_class="labelled")),
    # a constant schedule (no scheduler in the lean loop) at a rate that changes every round
    ("fedavg", dict(local_steps=3, lr_decay_per_round=0.5)),
])
@pytest.mark.parametrize("data", ["materialised", "transform"])
def test_lean_loop_gives_the_trainer_loops_weights_and_losses(algorithm, overrides, data):
    if overrides.get("model_class") == "labelled":
        overrides = dict(overrides, model_class=ClassifierWithConfig)
    make_train = (lambda: TRAIN) if data == "materialised" else noisy_train_data  # a random transform: datasets' path
    with tempfile.TemporaryDirectory() as tmp:
        with runtime.fast_path(True):
            lean, lean_clients = run(tmp + "/lean", make_train(), fed_algorithm=algorithm, **overrides)
        with runtime.fast_path(True, without=["client_loop"]):
            loop, loop_clients = run(tmp + "/loop", make_train(), fed_algorithm=algorithm,
                                     **overrides)
        assert lean_clients == 12 and loop_clients == 0  # 4 rounds x 3 clients, each through its loop
        assert torch.equal(lean.params, loop.params)
        assert [r["train_loss"] for r in lean.history] == [r["train_loss"] for r in loop.history]
        assert [r["local_steps"] for r in lean.history] == [r["local_steps"] for r in loop.history]
        other, _ = run(tmp + "/other", make_train(), fed_algorithm=algorithm, seed=8, **overrides)
        assert not torch.equal(lean.params, other.params)  # the comparison has teeth


class ClassifierWithConfig(DropoutClassifier):
    """With the ``config`` the Trainer reads when label smoothing is on (which calls it without labels)."""

    def __init__(self):
        super().__init__()
        self.config = SimpleNamespace(problem_type="single_label_classification")

    def forward(self, x, labels=None):
        return super().forward(x, labels) if labels is not None else {"logits": self.net(x)}


class Recorder(TrainerCallback):
    def __init__(self):
        self.steps = 0

    def on_step_end(self, args, state, control, **kwargs):
        self.steps += 1


def test_lean_loop_steps_aside_where_the_trainer_loop_would_do_more():
    with tempfile.TemporaryDirectory() as tmp:
        _, trainer = client_trainer_for(tmp)
        assert client_loop.applies(trainer, trainer.args)
        assert not client_loop.applies(trainer, trainer.args, resume_from_checkpoint="somewhere")
        recorder = Recorder()
        trainer.add_callback(recorder)  # a callback on the local Trainer: its events must fire
        assert not client_loop.applies(trainer, trainer.args)
        trainer.remove_callback(recorder)
        trainer.args.logging_strategy = "steps"
        assert not client_loop.applies(trainer, trainer.args)
        trainer.args.logging_strategy = "no"
        assert client_loop.applies(trainer, trainer.args)
    # a dataset that is neither materialised nor transformed rows keeps the Trainer's dataloader (the lean loop
    # still runs); transformed rows (runtime.transform_rows) are read one batch ahead
    with tempfile.TemporaryDirectory() as tmp:
        with runtime.fast_path(True, without=["transform_batches"]):
            local, trainer = client_trainer_for(tmp, train=noisy_train_data())
        trainer.train_dataset = local.client_dataset(0)
        assert client_loop.tensor_rows_loader(trainer, trainer.args) is None
    with tempfile.TemporaryDirectory() as tmp:
        local, trainer = client_trainer_for(tmp, train=noisy_train_data())
        trainer.train_dataset = local.client_dataset(0)
        assert client_loop.tensor_rows_loader(trainer, trainer.args).transformed
    with tempfile.TemporaryDirectory() as tmp:
        local, trainer = client_trainer_for(tmp, train_sampling_strategy="sequential")
        trainer.train_dataset = local.client_dataset(0)
        assert client_loop.tensor_rows_loader(trainer, trainer.args) is None


def test_a_callback_on_the_local_trainer_still_sees_every_step():
    with tempfile.TemporaryDirectory() as tmp:
        trainer = create_trainer(DropoutClassifier(), FedTrainingArguments(**settings(tmp, local_steps=2)), TRAIN,
                                 TEST, label_column="labels")
        recorder = Recorder()
        trainer.client_trainer.add_callback(recorder)
        trainer.train()
        assert recorder.steps == 4 * 3 * 2 and trainer.client_trainer.lean_loop_clients == 0


class DropoutOff(FederatedCallback):
    """Turns the dropout layer alone (not the model) to eval mode before every round's clients."""

    def on_round_begin(self, trainer, round_index, clients, **kwargs):
        trainer.client_trainer.model.net[1].eval()


class CountedTrain(DropoutClassifier):
    """A model overriding ``train`` (as DoRA layers or timm's distillation tasks do): counts its calls."""

    def __init__(self):
        super().__init__()
        self.train_calls = [0]

    def train(self, mode=True):
        self.train_calls[0] += 1
        return super().train(mode)


@pytest.mark.parametrize("model_class, callbacks", [(DropoutClassifier, [DropoutOff()]), (CountedTrain, None)])
def test_lean_loop_puts_every_module_in_training_mode_as_the_trainer_does(model_class, callbacks):
    """The lean loop calls ``model.train()`` once per client, skipped when every module is in training mode already
    and no module overrides ``train``: a submodule left in eval mode (the root in training mode) is switched back,
    and an overriding model's ``train`` runs for every client."""
    with tempfile.TemporaryDirectory() as tmp:
        with runtime.fast_path(True):
            lean, lean_clients = run(tmp + "/lean", TRAIN, model_class=model_class, callbacks=callbacks)
        with runtime.fast_path(True, without=["client_loop"]):
            loop, loop_clients = run(tmp + "/loop", TRAIN, model_class=model_class, callbacks=callbacks)
        assert lean_clients == 12 and loop_clients == 0
        assert torch.equal(lean.params, loop.params)
        dropout_off, _ = run(tmp + "/off", TRAIN, local_steps=1, callbacks=[DropoutOff()], eval_every_n_rounds=10)
        with runtime.fast_path(True, without=["client_loop"]):
            dropout_on, _ = run(tmp + "/on", TRAIN, local_steps=1, eval_every_n_rounds=10)
        assert torch.equal(dropout_off.params, dropout_on.params)  # ... because the dropout was switched back on
    if model_class is CountedTrain:
        model = CountedTrain()
        with tempfile.TemporaryDirectory() as tmp, runtime.fast_path(True):
            trainer = create_trainer(model, FedTrainingArguments(**settings(tmp, eval_every_n_rounds=10)), TRAIN,
                                     TEST, label_column="labels")
            trainer.train()
        assert trainer.client_trainer.lean_loop_clients == 12
        assert model.train_calls[0] >= 12  # every client's, though every module was in training mode


@pytest.mark.parametrize("schedule, built", [("constant", False), ("linear", True)])
def test_the_lean_loop_builds_no_scheduler_for_a_constant_schedule(schedule, built):
    """transformers' constant schedule only sets each rate to the one the reused optimizer has: the lean loop builds
    and steps none (its weights are the Trainer loop's: the test above); any other schedule is built and stepped."""
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        args = FedTrainingArguments(**settings(tmp, local_steps=3, lr_scheduler_type=schedule, lr_decay_per_round=0.5))
        trainer = create_trainer(DropoutClassifier(), args, TRAIN, TEST, label_column="labels")
        trainer.train()
        client = trainer.client_trainer
        assert client.lean_loop_clients == 12
        assert (client.lr_scheduler is not None) == built
        if built:  # stepped to the end of the last client's 3 steps: the linear schedule's rate is 0 there
            assert client.lr_scheduler.last_epoch == 3 and client.optimizer.param_groups[0]["lr"] == 0.0


def _clip_trainer(max_norm):
    accelerator = SimpleNamespace(distributed_type=DistributedType.NO, scaler=None)
    return SimpleNamespace(accelerator=accelerator, args=SimpleNamespace(max_grad_norm=max_norm),
                           _clip_grad_norm=None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("max_norm", [1e-3, 0.7, 1e9])
def test_direct_clipping_gives_torchs_clip_grad_norm_bit_for_bit(dtype, max_norm, monkeypatch):
    g = torch.Generator().manual_seed(3)
    shapes = [(5, 3), (3,), (4, 2, 2), (1,), (6,)]
    grads = [torch.randn(s, generator=g).to(dtype) * 3 for s in shapes]
    grads[3] = None  # a parameter the loss did not reach
    grads[4][2] = math.inf if max_norm == 0.7 else grads[4][2]  # a non-finite gradient: NaNs, the same ones

    def params_with(grads):
        params = [torch.nn.Parameter(torch.zeros(s, dtype=dtype)) for s in shapes]
        for p, grad in zip(params, grads):
            p.grad = None if grad is None else grad.clone()
        return params

    expected_params = params_with(grads)
    expected_norm = torch.nn.utils.clip_grad_norm_(expected_params, max_norm)
    params = params_with(grads)
    clip = client_loop.direct_clipping(_clip_trainer(max_norm), params)
    with monkeypatch.context() as patched:  # the direct path: torch's function is not called
        patched.setattr(torch.nn.utils, "clip_grad_norm_", lambda *a, **k: pytest.fail("torch's clipping ran"))
        norm = clip(None)
    assert torch.equal(norm, expected_norm) or (norm.isnan() and expected_norm.isnan()) or (
        norm.isinf() and expected_norm.isinf())
    for p, q in zip(params, expected_params):
        assert (p.grad is None) == (q.grad is None)
        if p.grad is not None:
            assert p.grad.dtype == dtype and torch.equal(p.grad.isnan(), q.grad.isnan())
            assert torch.equal(p.grad.nan_to_num(), q.grad.nan_to_num())
    changed = any(p.grad is not None and not torch.equal(p.grad, grad) for p, grad in zip(params, grads))
    assert changed == (max_norm != 1e9)  # the comparison has teeth: clipping happened where it should


def test_direct_clipping_leaves_mixed_dtypes_to_torch(monkeypatch):
    params = [torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2, dtype=torch.float64))]
    for p in params:
        p.grad = torch.full_like(p, 10.0)
    calls = []
    real = torch.nn.utils.clip_grad_norm_
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda *a, **k: calls.append(1) or real(*a, **k))
    client_loop.direct_clipping(_clip_trainer(1.0), params)(None)
    assert calls == [1]
    assert abs(float(torch.cat([p.grad.double() for p in params]).norm()) - 1.0) < 1e-5


def test_direct_optimizer_step_is_the_torch_step_where_accelerates_wrapper_adds_nothing():
    import warnings

    from accelerate import Accelerator
    from accelerate.optimizer import AcceleratedOptimizer

    model = torch.nn.Linear(3, 2)
    optimizer = Accelerator(cpu=True).prepare(torch.optim.SGD(model.parameters(), lr=0.5))
    assert type(optimizer) is AcceleratedOptimizer
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))
    step = client_loop.direct_optimizer_step(optimizer)
    assert step != optimizer.step  # (a bound method compares equal to itself, not to the direct step)
    before = model.weight.detach().clone()
    model(torch.ones(4, 3)).sum().backward()
    expected = before - 0.5 * model.weight.grad
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns when the scheduler steps before a flagged optimizer step
        step()
        scheduler.step()
    assert torch.equal(model.weight.detach(), expected) and optimizer.param_groups[0]["lr"] == 0.25
    optimizer.scaler = object()  # a gradient scaler: accelerate's step does more
    assert client_loop.direct_optimizer_step(optimizer) == optimizer.step
    optimizer.scaler = None

    class Wrapped(AcceleratedOptimizer):  # a subclass may override step
        pass

    optimizer.__class__ = Wrapped
    assert client_loop.direct_optimizer_step(optimizer) == optimizer.step


def test_the_lean_loop_steps_past_accelerates_optimizer_wrapper(monkeypatch):
    from accelerate.optimizer import AcceleratedOptimizer

    calls = []
    real = AcceleratedOptimizer.step
    monkeypatch.setattr(AcceleratedOptimizer, "step", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    with tempfile.TemporaryDirectory() as tmp:
        with runtime.fast_path(True):
            _, lean_clients = run(tmp + "/lean", TRAIN, local_steps=2, num_rounds=2)
        assert lean_clients == 6 and calls == []
        with runtime.fast_path(True, without=["client_loop"]):
            run(tmp + "/loop", TRAIN, local_steps=2, num_rounds=2)
        assert len(calls) == 6 * 2  # the Trainer's loop: through the wrapper, every step
