"""The papers' measurements in a run (``hf_fedflat.diagnostics.run``), each checked against a hand computation
on the tiny model: bytes per round, gradient conflict, perturbation drift, sharpness and accuracies, rounds to a
target accuracy, the loss surface."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from hf_fedflat import FederatedCallback

from helpers.runs import TRAIN, run


class Capture(FederatedCallback):
    def __init__(self):
        self.rounds = []
        self.starts = []

    def on_round_begin(self, trainer, round_index, clients, **kwargs):
        self.starts.append(trainer.space.flatten().clone())

    def on_aggregate(self, trainer, round_index, updates, **kwargs):
        self.rounds.append(updates)


def run_captured(tmp_path, **overrides):
    capture = Capture()
    overrides.setdefault("num_rounds", 2)
    trainer, output = run(tmp_path, callbacks=[capture], **overrides)
    return trainer, output, capture


def full_loss(model, space, params, x, y):
    names = dict(zip(space.names, space.split(params)))
    logits = torch.func.functional_call(model, names, (x,))["logits"]
    return nn.functional.cross_entropy(logits, y)


def test_bytes_per_round(tmp_path):
    trainer, output, _ = run_captured(tmp_path / "avg", fed_algorithm="fedavg")
    d = trainer.space.numel * 4  # float32
    assert output.history[0]["bytes_down"] == 3 * d and output.history[0]["bytes_up"] == 3 * d
    trainer, output, _ = run_captured(tmp_path / "scaffold", fed_algorithm="scaffold")
    # SCAFFOLD: w and c down; only Delta_i up (option II's dc_i is computed by the server from Delta_i and K_i)
    assert output.history[0]["bytes_down"] == 3 * 2 * d and output.history[0]["bytes_up"] == 3 * d


def test_gradient_conflict_ratio(tmp_path):
    trainer, output, capture = run_captured(tmp_path, fed_algorithm="fedavg", diagnostics="gradient_conflict",
                                            clients_per_round=4, partition_scheme="dirichlet", dirichlet_alpha=0.1)
    for record, updates in zip(output.history, capture.rounds):
        deltas = [u.delta for u in updates]
        pairs = [(i, j) for i in range(4) for j in range(i + 1, 4)]
        expected = sum(float(deltas[i] @ deltas[j]) < 0 for i, j in pairs) / len(pairs)
        assert record["gradient_conflict_ratio"] == pytest.approx(expected)


def test_perturbation_drift_of_fedsam(tmp_path):
    rho = 0.2
    trainer, output, capture = run_captured(tmp_path, fed_algorithm="fedsam", rho=rho,
                                            diagnostics="perturbation_drift", num_rounds=1)
    w0 = capture.starts[0]
    updates = capture.rounds[0]
    sizes = torch.tensor([u.num_samples for u in updates], dtype=torch.float64)
    p = sizes / sizes.sum()
    gradients, offsets = [], []
    for u in updates:
        data = trainer.partition.client_dataset(TRAIN, u.client_id)[:]
        w = w0.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(full_loss(trainer.model, trainer.space, w, data["x"], data["labels"]), w)
        torch.testing.assert_close(u.messages["diagnostics"]["gradient"], g, rtol=1e-5, atol=1e-6)
        gradients.append(g)
        offsets.append(rho * g / g.norm())
    mean_g = sum(float(pi) * g for pi, g in zip(p, gradients))
    e_global = rho * mean_g / mean_g.norm()
    expected = sum((e - e_global).norm().item() for e in offsets) / len(offsets)
    assert output.history[0]["perturbation_drift"] == pytest.approx(expected, rel=1e-4)
    assert output.history[0]["bytes_up"] == 3 * trainer.space.numel * 4  # diagnostics are not traffic


def test_sharpness_train_accuracy_and_client_accuracy(tmp_path):
    rho = 0.5
    trainer, output, _ = run_captured(tmp_path, fed_algorithm="fedavg", rho=rho, num_rounds=1,
                                      diagnostics="sharpness,train_accuracy,client_accuracy")
    record = output.history[0]
    w = output.params.clone().requires_grad_(True)
    data = TRAIN[:]  # diagnostics_num_samples (1024) > 96 rows: the subset is the whole training set
    loss = full_loss(trainer.model, trainer.space, w, data["x"], data["labels"])
    (g,) = torch.autograd.grad(loss, w)
    perturbed = full_loss(trainer.model, trainer.space, output.params + rho * g / g.norm(), data["x"], data["labels"])
    assert record["sharpness"] == pytest.approx(float((perturbed - loss).detach()), rel=1e-4, abs=1e-6)
    with torch.no_grad():
        names = dict(zip(trainer.space.names, trainer.space.split(output.params)))
        correct = (torch.func.functional_call(trainer.model, names, (data["x"],))["logits"].argmax(1) == data["labels"])
    assert record["train_accuracy"] == pytest.approx(correct.float().mean().item())
    assert record["train_test_gap"] == pytest.approx(record["train_accuracy"] - record["eval_accuracy"])
    per_client = [correct[torch.tensor(rows)].float().mean().item() for rows in trainer.partition.client_indices]
    assert record["client_accuracy_mean"] == pytest.approx(sum(per_client) / len(per_client))


def test_rounds_to_target_accuracy(tmp_path):
    _, reference = run(tmp_path / "ref", fed_algorithm="fedavg", num_rounds=4, local_steps=4)
    accuracies = [r["eval_accuracy"] for r in reference.history]
    target = sorted(set(accuracies))[len(set(accuracies)) // 2]
    _, output = run(tmp_path / "t", fed_algorithm="fedavg", num_rounds=4, local_steps=4, target_accuracy=target)
    first = next(i for i, a in enumerate(accuracies) if a >= target)
    marked = [i for i, r in enumerate(output.history) if "rounds_to_target" in r]
    assert marked == [first]
    assert output.history[first]["rounds_to_target"] == first + 1
    assert output.history[first]["seconds_to_target"] == output.history[first]["wall_seconds"]


def test_loss_surface_png_and_grid(tmp_path):
    trainer, output, _ = run_captured(tmp_path, fed_algorithm="fedavg", num_rounds=1, diagnostics="loss_surface",
                                      loss_surface_resolution=5)
    surface = json.loads((tmp_path / "loss_surface.json").read_text())
    assert surface["coords"] == pytest.approx([-1, -0.5, 0, 0.5, 1])
    data = TRAIN[:]
    centre = full_loss(trainer.model, trainer.space, output.params, data["x"], data["labels"]).item()
    assert surface["losses"][2][2] == pytest.approx(centre, rel=1e-5)
    assert len({round(v, 6) for row in surface["losses"] for v in row}) > 5  # the surface is not flat
    assert (tmp_path / "loss_surface.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
