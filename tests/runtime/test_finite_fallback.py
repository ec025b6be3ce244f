"""No host-device sync in the training step, checked on the CPU.

The perturbations' finiteness fallback (``runtime.finite_fallback``, around the gradient oracle) runs on the device
on accelerators. Here that path is forced on the CPU: for every registered perturbation it must give the host
path's values bit for bit, finite offsets or not, and read nothing on the host; with it no preset's step may read a
tensor on the host (``HostReadCounter``: each read would be a sync on a GPU).
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from hf_fedflat import FedTrainingArguments, ParameterSpace, create_trainer, list_algorithms
from hf_fedflat.algorithms import ClientContext, LocalResult, Perturbation
from hf_fedflat.algorithms.registry import PERTURBATIONS
from hf_fedflat.diagnostics import HostReadCounter
from hf_fedflat.runtime import client_loop, finite_fallback
from hf_fedflat.runtime.finite_fallback import device_side_checks
from hf_fedflat.training.client_trainer import ClientTrainer

from conftest import TinyClassifier
from helpers.runs import TEST, TRAIN, run

TRAINING_STEP, LOCAL_LOOP = ClientTrainer.training_step, client_loop.run  # (unpatched, whatever a test patches)
CPU = torch.device("cpu")

#: every registered perturbation with its defaults, and the settings besides them that take another path
CASES = [(name, {}) for name in sorted(PERTURBATIONS)] + [
    ("gam_first_order", {"hvp_mode": "finite_difference"}), ("lesam", {"lesam_direction": "last_global_update"}),
]
IDS = [name + "".join(f"-{v}" for v in overrides.values()) for name, overrides in CASES]
#: perturbations whose direction mixes a vector that is not a gradient into their one pass's (FedWMSAM's momentum)
MIXES_A_VECTOR_IN = {"wmsam"}


def _perturbation(name, overrides):
    cls = PERTURBATIONS[name]
    return cls(cls.config_class(**overrides))


class TinyOracle:
    """The gradient oracle of a tiny classifier on one batch (``hf_fedflat.algorithms.GradientOracle``).

    ``poison``: the first pass overflowed: its gradient (and a Hessian-vector product's ``H v``) has an Inf.
    ``requests``: the passes of each request, in order (a Hessian-vector product counts two).
    """

    def __init__(self, poison: bool = False):
        torch.manual_seed(3)
        self.model = TinyClassifier()
        self.space = ParameterSpace(self.model)
        self.w = self.space.flatten()
        self.x, self.y = torch.randn(8, 4), torch.randint(0, 3, (8,))
        self.poison = poison
        self.requests: list[int] = []
        self.first_gradient = None

    def _loss_at(self, offset):
        self.space.load_(self.w if offset is None else self.w + offset)
        self.model.zero_grad(set_to_none=True)
        return self.model(self.x, labels=self.y)["loss"]

    def _answer(self, passes, gradient, *more):
        if not self.requests:
            if self.poison:
                for vector in (gradient, *more):
                    vector[1] = float("inf")
            self.first_gradient = gradient.clone()
        self.requests.append(passes)

    def __call__(self, offset):
        loss = self._loss_at(offset)
        loss.backward()
        gradient = self.space.grad()
        self._answer(1, gradient)
        return loss.detach(), gradient

    def weights(self):
        return self.w

    def parameter_mask(self, name_part):
        return self.space.parameter_mask(name_part)

    def bias_scale(self):
        return 1.0

    def hessian_vector_product(self, vector=None):
        loss = self._loss_at(None)
        grads = torch.autograd.grad(loss, self.space.params, create_graph=True)
        gradient = torch.cat([g.reshape(-1) for g in grads])
        v = gradient.detach() if vector is None else vector
        product = torch.cat([h.reshape(-1) for h in torch.autograd.grad(gradient @ v, self.space.params)])
        gradient = gradient.detach().clone()
        self._answer(2, gradient, product)
        return loss.detach(), gradient, product


def _workspace(perturbation, w):
    """What the perturbation's ``begin`` gives a client that took part before: its server state and its client
    state (from its own ``end``) with random values."""
    g = torch.Generator().manual_seed(5)

    def noisy(parts):
        return {key: torch.randn(value.shape, generator=g) * 1e-2 for key, value in parts.items()}

    name = perturbation.name
    broadcast = {name: noisy(perturbation.broadcast(perturbation.init_server_state(w)))}
    ctx = ClientContext(0, 1, w, broadcast, {}, learning_rate=0.1, num_samples=8)
    state, _ = perturbation.end(ctx, perturbation.begin(ctx), LocalResult(w, 1, torch.zeros_like(w)))
    ctx.state = {name: noisy(state or {})}
    return perturbation.begin(ctx)


def _direction(name, overrides, poison, device_side):
    oracle = TinyOracle(poison)
    perturbation = _perturbation(name, overrides)
    workspace = _workspace(perturbation, oracle.w)
    initial = dict(workspace) if isinstance(workspace, dict) else {}
    if device_side:
        with device_side_checks():
            loss, direction = finite_fallback.direction(perturbation, oracle, workspace, CPU)
    else:
        loss, direction = finite_fallback.direction(perturbation, oracle, workspace, CPU)
    return loss, direction, workspace, initial, oracle


@pytest.mark.parametrize("name,overrides", CASES, ids=IDS)
@pytest.mark.parametrize("poison", [False, True], ids=["finite", "inf_gradient"])
def test_device_side_checks_give_the_host_paths_values(name, overrides, poison):
    host_loss, host_direction, host_workspace, _, host = _direction(name, overrides, poison, False)
    loss, direction, workspace, initial, device = _direction(name, overrides, poison, True)
    assert torch.equal(loss, host_loss)
    torch.testing.assert_close(direction, host_direction, equal_nan=True, rtol=0, atol=0)
    tensors = [key for key, value in initial.items() if isinstance(value, torch.Tensor)]
    for key in tensors:  # per-step state (SMOO's mu) moves only on a usable step
        torch.testing.assert_close(workspace[key], host_workspace[key], rtol=0, atol=0)
        if poison:
            assert torch.equal(workspace[key], initial[key])
    if name == "smoo":
        assert torch.equal(workspace["mu"], initial["mu"]) == poison
    passes = PERTURBATIONS[name].passes_per_step
    if poison:  # the host path falls back after the first request; the device path runs them all and discards them
        assert sum(host.requests) == host.requests[0] and sum(device.requests) == passes
        assert not torch.isfinite(direction).all()
        if name in MIXES_A_VECTOR_IN:  # its one pass is at a finite offset (no fallback): the mix is not finite
            assert torch.equal(torch.isfinite(direction), torch.isfinite(device.first_gradient))
        else:
            torch.testing.assert_close(direction, device.first_gradient, equal_nan=True, rtol=0, atol=0)
    else:
        assert sum(device.requests) == sum(host.requests) == passes
        assert torch.isfinite(direction).all()


@pytest.mark.parametrize("name,overrides", CASES, ids=IDS)
@pytest.mark.parametrize("poison", [False, True], ids=["finite", "inf_gradient"])
def test_no_perturbation_reads_the_host_with_device_side_checks(name, overrides, poison):
    oracle = TinyOracle(poison)
    perturbation = _perturbation(name, overrides)
    workspace = _workspace(perturbation, oracle.w)
    with HostReadCounter() as counter, device_side_checks():
        finite_fallback.direction(perturbation, oracle, workspace, CPU)
    assert counter.total == 0, dict(counter.sites)


class WritesIntoItsFirstGradient(Perturbation):
    name = "writes_into_its_first_gradient"
    passes_per_step = 2

    def direction(self, grad_at, workspace):
        loss, g = grad_at(None)
        _, g2 = grad_at(g * 0.1)
        return loss, g.add_(g2)


def test_a_perturbation_may_not_write_into_its_first_gradient():
    """That gradient is the step's direction where an offset is not finite: writing into it would change the
    fallback on the device (the host path would have stopped before)."""
    for device_side in (False, True):
        with pytest.raises(RuntimeError, match="first pass"):
            with device_side_checks() if device_side else contextlib.nullcontext():
                finite_fallback.direction(WritesIntoItsFirstGradient(), TinyOracle(), None, CPU)


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


def test_without_device_side_checks_the_sam_step_reads_its_offset_once(monkeypatch, tmp_path):
    """The counter sees what the device path removes: one read per step on the CPU path (the offset's sum)."""
    step_counter = HostReadCounter()

    def counted_step(self, *args, **kwargs):
        with step_counter:
            return TRAINING_STEP(self, *args, **kwargs)

    monkeypatch.setattr(ClientTrainer, "training_step", counted_step)
    run(tmp_path, fed_algorithm="fedsam", num_rounds=1, local_steps=3, clients_per_round=2, num_clients=4)
    assert step_counter.total == 2 * 3
    assert [site.split(":")[0] for _, site in step_counter.sites] == ["finite_fallback.py"]
