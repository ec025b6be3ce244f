"""No host-device sync in the training step (issue 20), checked on the CPU.

The SAM family's finiteness fallback runs on the device on accelerators (``algorithms.device_checks``). Here
that path is forced on the CPU: it must give the host path's values bit for bit, finite norm or not, and with
it no preset's step may read a tensor on the host (``HostReadCounter``: each read would be a sync on a GPU).
"""

from __future__ import annotations

import pytest
import torch

from hf_fedflat import FedTrainingArguments, ParameterSpace, create_trainer, list_algorithms
from hf_fedflat.algorithms.device_checks import device_side_checks
from hf_fedflat.algorithms.registry import PERTURBATIONS
from hf_fedflat.diagnostics import HostReadCounter
from hf_fedflat.runtime import client_loop
from hf_fedflat.training.client_trainer import ClientTrainer

from conftest import TinyClassifier
from test_federated_run import TEST, TRAIN, run

TRAINING_STEP, LOCAL_LOOP = ClientTrainer.training_step, client_loop.run  # (unpatched, whatever a test patches)

# (perturbation, config overrides): every perturbation with a finiteness fallback
GUARDED = [
    ("sam", {}), ("fedspeed_sam", {}), ("smoo", {}), ("gam", {}), ("gam_original", {}),
    ("gam_first_order", {"hvp_mode": "finite_difference"}),
]


def _perturbation(name, overrides):
    cls = PERTURBATIONS[name]
    return cls(cls.config_class(**overrides))


def _grad_at(poison: bool = False):
    """``grad_at(offset)`` of a tiny classifier on one batch; ``poison``: the gradient at ``w`` has an Inf."""
    torch.manual_seed(3)
    model = TinyClassifier()
    space = ParameterSpace(model)
    w = space.flatten()
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    calls = []

    def grad_at(offset):
        space.load_(w if offset is None else w + offset)
        model.zero_grad(set_to_none=True)
        loss = model(x, labels=y)["loss"]
        loss.backward()
        grad = space.grad()
        calls.append(offset is None)
        if poison and offset is None:
            grad[1] = float("inf")
        return loss.detach(), grad

    return grad_at, w.numel(), calls


def _workspace(name, numel):
    if name != "smoo":
        return None
    g = torch.Generator().manual_seed(5)
    return {"s": torch.randn(numel, generator=g) * 1e-2, "mu": torch.randn(numel, generator=g) * 1e-2}


def _direction(name, overrides, poison, device_side):
    grad_at, numel, calls = _grad_at(poison)
    workspace = _workspace(name, numel)
    perturbation = _perturbation(name, overrides)
    if device_side:
        with device_side_checks():
            loss, direction = perturbation.direction(grad_at, workspace)
    else:
        loss, direction = perturbation.direction(grad_at, workspace)
    return loss, direction, workspace, len(calls)


@pytest.mark.parametrize("name,overrides", GUARDED, ids=[g[0] for g in GUARDED])
@pytest.mark.parametrize("poison", [False, True], ids=["finite", "inf_gradient"])
def test_device_side_checks_give_the_host_paths_values(name, overrides, poison):
    host_loss, host_direction, host_workspace, host_passes = _direction(name, overrides, poison, False)
    loss, direction, workspace, passes = _direction(name, overrides, poison, True)
    assert torch.equal(loss, host_loss)
    # gam_original's projection coefficient multiplies h+ apart on the device (the host fuses it into sub_)
    tolerance = dict(rtol=1e-6, atol=1e-8) if name == "gam_original" and not poison else dict(rtol=0, atol=0)
    torch.testing.assert_close(direction, host_direction, equal_nan=True, **tolerance)
    if workspace is not None:  # SMOO's mu moves only on a usable step
        torch.testing.assert_close(workspace["mu"], host_workspace["mu"], rtol=0, atol=0)
        assert torch.equal(workspace["mu"], _workspace(name, direction.numel())["mu"]) == poison
    if poison:  # the host path falls back after one pass; the device path runs them all and discards them
        assert host_passes == 1 and passes == PERTURBATIONS[name].passes_per_step
        assert not torch.isfinite(direction).all()
    else:
        assert passes == host_passes == PERTURBATIONS[name].passes_per_step
        assert torch.isfinite(direction).all()


def test_the_counter_counts_host_reads():
    t = torch.ones(3)
    with HostReadCounter() as counter:
        t.sum().item()
        bool(t.sum() > 0)
        float(t[0])
        t.tolist()
        (t * 2).add_(1)  # device work: not a read
    assert counter.total == 4
    assert sum(counter.sites.values()) == 4


def _host_reads_per_region(monkeypatch, tmp_path, algorithm, local_steps):
    """Host reads inside the training step and inside the whole local loop, device-side checks on."""
    step_counter, loop_counter = HostReadCounter(), HostReadCounter()

    def counted_step(self, *args, **kwargs):
        with step_counter:
            return TRAINING_STEP(self, *args, **kwargs)

    def counted_loop(*args, **kwargs):
        with loop_counter:
            return LOCAL_LOOP(*args, **kwargs)

    monkeypatch.setattr(ClientTrainer, "training_step", counted_step)
    monkeypatch.setattr(client_loop, "run", counted_loop)
    args = FedTrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, fed_algorithm=algorithm, num_clients=4, clients_per_round=2,
        num_rounds=1, local_steps=local_steps, per_device_train_batch_size=4, partition_scheme="iid",
        learning_rate=0.1, seed=7, disable_tqdm=True)
    torch.manual_seed(0)
    trainer = create_trainer(TinyClassifier(), args, TRAIN, TEST, label_column="labels")  # (gossip ones too)
    with device_side_checks():
        trainer.train()
    clients = trainer.client_trainer.lean_loop_clients
    return step_counter, loop_counter, clients


@pytest.mark.parametrize("algorithm", sorted(list_algorithms()))
def test_no_preset_reads_the_host_in_its_step(monkeypatch, tmp_path, algorithm):
    steps, loop, clients = _host_reads_per_region(monkeypatch, tmp_path / "a", algorithm, local_steps=2)
    assert steps.total == 0, dict(steps.sites)
    _, longer_loop, longer_clients = _host_reads_per_region(monkeypatch, tmp_path / "b", algorithm, local_steps=4)
    # the local loop reads once per client (its mean loss), whatever the number of steps
    assert clients == longer_clients > 0
    assert loop.total == longer_loop.total == clients, (dict(loop.sites), dict(longer_loop.sites))


def test_without_device_side_checks_the_sam_step_reads_the_norm(monkeypatch, tmp_path):
    """The counter sees what the device path removes: one read per step on the CPU path."""
    step_counter = HostReadCounter()

    def counted_step(self, *args, **kwargs):
        with step_counter:
            return TRAINING_STEP(self, *args, **kwargs)

    monkeypatch.setattr(ClientTrainer, "training_step", counted_step)
    run(tmp_path, fed_algorithm="fedsam", num_rounds=1, local_steps=3, clients_per_round=2, num_clients=4)
    assert step_counter.total == 2 * 3
    assert [site.split(":")[0] for _, site in step_counter.sites] == ["device_checks.py"]
