"""Decentralized runs: presets, local steps by hand, gossip in the trainer, FedAvg equivalence, resume, 2 processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from hf_fedflat import DecentralizedTrainer, FederatedCallback, FedTrainingArguments, FederatedTrainer, get_preset
from hf_fedflat.federation.trainer_factory import trainer_class_for
from hf_fedflat.federation.outcome import TrainingFailedError

from conftest import TinyClassifier, make_tiny_dataset, tiny_loss
from helpers import REPO_ROOT as ROOT

TRAIN = make_tiny_dataset(n=96, seed=1)
TEST = make_tiny_dataset(n=30, seed=2)
DECENTRALIZED = ("dfedavg", "dfedavgm", "dpsgd", "dfedsam", "dfedgam")


def settings(output_dir, **overrides):
    values = dict(
        output_dir=str(output_dir), use_cpu=True, fed_algorithm="dfedavg", num_clients=6, clients_per_round=3,
        num_rounds=3, local_steps=2, per_device_train_batch_size=4, partition_scheme="iid", learning_rate=0.1,
        lr_decay_per_round=0.9, seed=7, topology="ring", disable_tqdm=True,
        decentralized_participation="sampled",  # (the presets' default is the seeds' full participation)
    )
    values.update(overrides)
    if values["fed_algorithm"] not in DECENTRALIZED:  # a server run refuses the gossip settings
        for key in ("topology", "decentralized_participation"):
            if key not in overrides:
                values.pop(key)
    return values


def run(output_dir, *, resume=None, model_seed=0, trainer_class=DecentralizedTrainer, callbacks=None, **overrides):
    extra = {"local_eval_models": overrides.pop("local_eval_models")} if "local_eval_models" in overrides else {}
    args = FedTrainingArguments(**settings(output_dir, **overrides))
    torch.manual_seed(model_seed)
    trainer = trainer_class(TinyClassifier(), args, TRAIN, TEST, label_column="labels", callbacks=callbacks, **extra)
    return trainer, trainer.train(resume_from_checkpoint=resume)


def local_models(trainer):
    return torch.stack([trainer.local_model(c)["params"] for c in range(trainer.args.num_clients)])


# --- presets and the factory -------------------------------------------------------------------------
@pytest.mark.parametrize("name", DECENTRALIZED)
def test_presets_compose_gossip_and_pick_the_decentralized_trainer(tmp_path, name):
    spec = get_preset(name)
    assert spec.aggregator == "gossip" and spec.corrections == ()
    assert spec.perturbation == {"dfedsam": "sam", "dfedgam": "gam_first_order"}.get(name, "none")  # DFedGAM eq. 7-8
    args = FedTrainingArguments(**settings(tmp_path, fed_algorithm=name, local_steps=None))
    assert trainer_class_for(args) is DecentralizedTrainer
    assert args.local_steps == (1 if name == "dpsgd" else None)
    assert args.optim_args == ("momentum=0.9" if name == "dfedavgm" else None)


def test_factory_and_refusals(tmp_path):
    assert trainer_class_for(FedTrainingArguments(**settings(tmp_path, fed_algorithm="fedavg"))) is FederatedTrainer
    with pytest.raises(ValueError, match="aggregator: 'mean' updates a global model"):
        DecentralizedTrainer(TinyClassifier(), FedTrainingArguments(**settings(tmp_path, fed_algorithm="fedavg")),
                             TRAIN, TEST, label_column="labels")
    with pytest.raises(ValueError, match="corrections: scaffold needs server-side state"):
        DecentralizedTrainer(TinyClassifier(), FedTrainingArguments(**settings(tmp_path, corrections="scaffold")),
                             TRAIN, TEST, label_column="labels")
    # gossip has no global model to update: the server loop refuses it and names the trainer to use
    with pytest.raises(ValueError, match="aggregator: 'gossip' is decentralized .*create_trainer"):
        FederatedTrainer(TinyClassifier(), FedTrainingArguments(**settings(tmp_path)), TRAIN, TEST, label_column="labels")


# --- local steps by hand ------------------------------------------------------------------------------
def client_setup(tmp_path, **overrides):
    """A DecentralizedTrainer with 2 clients of 8 samples each; batch 8 = the client's whole data."""
    data = make_tiny_dataset(n=16, seed=3)
    args = FedTrainingArguments(**settings(tmp_path, num_clients=2, clients_per_round=2, per_device_train_batch_size=8,
                                           **overrides))
    torch.manual_seed(0)
    model = TinyClassifier()
    trainer = DecentralizedTrainer(model, args, data, TEST, label_column="labels")
    client = trainer.partition.client_dataset(data, 0)[:]
    return trainer, model, client["x"], client["labels"]


def hand_grad(model, flat_params, x, y, space):
    params = [p.clone().requires_grad_(True) for p in space.split(flat_params)]
    grads = torch.autograd.grad(tiny_loss(model, params, x, y), params)
    return torch.cat([g.reshape(-1) for g in grads])


def test_dfedavgm_is_heavy_ball_momentum_reset_every_round(tmp_path):
    trainer, model, x, y = client_setup(tmp_path, fed_algorithm="dfedavgm", local_steps=2)
    space, lr = trainer.space, 0.1

    def heavy_ball(w, steps):
        velocity = torch.zeros_like(w)
        for _ in range(steps):
            velocity = 0.9 * velocity + hand_grad(model, w, x, y, space)
            w = w - lr * velocity
        return w

    start = space.flatten()
    first = trainer.train_client(0, 0, lr, start, {}, {})
    after_first = start + first.delta
    torch.testing.assert_close(after_first, heavy_ball(start, 2), rtol=0, atol=1e-6)
    second = trainer.train_client(0, 1, lr, after_first, {}, {})  # the next round starts with zero momentum
    torch.testing.assert_close(after_first + second.delta, heavy_ball(after_first, 2), rtol=0, atol=1e-6)
    assert (heavy_ball(start, 4) - (after_first + second.delta)).abs().max() > 1e-4  # carried momentum differs


def test_dfedgam_local_step_equals_the_fedgam_formula(tmp_path):
    rho, alpha, lr = 0.3, 0.5, 0.1
    # the FedGAM form stays available as the perturbation "gam" (the preset's own step: tests/perturbations/test_gam_first_order.py)
    trainer, model, x, y = client_setup(tmp_path, fed_algorithm="dfedgam", perturbation="gam", rho=rho,
                                        gam_alpha=alpha, local_steps=1)
    w = trainer.space.flatten()
    g = hand_grad(model, w, x, y, trainer.space)
    ascent = hand_grad(model, w + rho * g / (g.norm() + 1e-12), x, y, trainer.space)
    update = trainer.train_client(0, 0, lr, w, {}, {})
    torch.testing.assert_close(update.delta, -lr * (g + alpha * rho * ascent), rtol=0, atol=1e-6)
    assert (alpha * rho * ascent).abs().max() > 1e-3  # the flatness term matters here


# --- the round loop -------------------------------------------------------------------------------------
class GossipCheck(FederatedCallback):
    """Records x_j before each round and z_j / the new x_i after gossip, to check x_i = sum_j W_ij z_j."""

    def __init__(self):
        self.errors = []

    def on_round_begin(self, trainer, round_index, clients, **kwargs):
        self.before = local_models(trainer).clone()

    def on_aggregate(self, trainer, round_index, updates, **kwargs):
        z = self.before.clone()
        for update in updates:
            z[update.client_id] += update.delta
        weights = torch.from_numpy(trainer.algorithm.aggregator.mixing_matrix(round_index).weights).float()
        self.errors.append((local_models(trainer) - weights @ z).abs().max().item())
        self.trained = [u.client_id for u in updates]


def test_dfedavg_run_gossips_by_the_matrix_and_logs_consensus(tmp_path):
    check = GossipCheck()
    trainer, output = run(tmp_path, callbacks=[check], diagnostics="train_accuracy")
    assert len(check.errors) == 3 and max(check.errors) < 1e-6
    history = json.loads((tmp_path / "history.json").read_text())
    assert [r["round"] for r in history] == [1, 2, 3]
    for record in history:
        assert record["num_clients"] == 3 and record["spectral_gap"] == pytest.approx(1 / 3)
        for key in ("eval_accuracy", "eval_loss", "train_loss", "consensus_distance", "local_eval_accuracy_mean",
                    "local_eval_accuracy_std", "wall_seconds"):
            assert key in record
    # x_bar is the mean of the local models, and the consensus distance the mean distance to it
    models = local_models(trainer)
    average = models.double().mean(dim=0)
    torch.testing.assert_close(output.params, average.float(), rtol=0, atol=0)
    distance = (models.double() - average).norm(dim=1).mean().item()
    assert history[-1]["consensus_distance"] == pytest.approx(distance, rel=1e-12) and distance > 1e-4
    # the local models' accuracies are those of the stored models (all 6: N <= 20)
    accuracies = [trainer.evaluate(models[c])["eval_accuracy"] for c in range(6)]
    assert history[-1]["local_eval_accuracy_mean"] == pytest.approx(np.mean(accuracies))
    assert history[-1]["local_eval_accuracy_std"] == pytest.approx(np.std(accuracies))
    assert history[-1]["eval_accuracy"] == pytest.approx(trainer.evaluate(output.params)["eval_accuracy"])
    # opt-in diagnostics measure x_bar too
    assert history[-1]["train_test_gap"] == pytest.approx(history[-1]["train_accuracy"] - history[-1]["eval_accuracy"])
    config = json.loads((tmp_path / "final_model" / "federated_config.json").read_text())
    assert config["decentralized"]["topology"] == "ring" and config["algorithm"]["aggregator"] == "gossip"


def test_full_topology_gossip_equals_fedavg_with_uniform_weights(tmp_path):
    common = dict(num_clients=4, clients_per_round=4, num_rounds=2, partition_scheme="dirichlet", dirichlet_alpha=0.5,
                  min_partition_size=8)
    decentralized, gossip = run(tmp_path / "gossip", topology="full", decentralized_participation="full", **common)
    federated, fedavg = run(tmp_path / "fedavg", trainer_class=FederatedTrainer, fed_algorithm="fedavg",
                            aggregation_weights="uniform", **common)
    assert len(set(federated.client_sizes)) > 1  # unequal clients: uniform and sample weights differ
    torch.testing.assert_close(gossip.params, fedavg.params, rtol=0, atol=1e-5)
    for model in local_models(decentralized):
        torch.testing.assert_close(model, fedavg.params, rtol=0, atol=1e-5)
    assert decentralized.history[-1]["consensus_distance"] < 1e-6
    assert decentralized.history[-1]["eval_loss"] == pytest.approx(federated.history[-1]["eval_loss"], abs=1e-5)


def test_resume_equals_uninterrupted(tmp_path):
    common = dict(fed_algorithm="dfedsam", topology="random_regular", topology_degree=3, topology_redraw=True,
                  client_state_store="disk", local_eval_models=2)
    full, full_out = run(tmp_path / "full", **common)
    run(tmp_path / "cut", **common, num_rounds=1, save_every_n_rounds=1)
    assert len(list((tmp_path / "cut" / "checkpoints" / "round-1" / "client_states").iterdir())) == 6
    resumed, resumed_out = run(tmp_path / "cut", resume="latest", model_seed=123, **common)
    torch.testing.assert_close(resumed_out.params, full_out.params, rtol=0, atol=0)
    torch.testing.assert_close(local_models(resumed), local_models(full), rtol=0, atol=0)
    assert [r["round"] for r in resumed.history] == [1, 2, 3]
    for key in ("eval_loss", "local_eval_accuracy_mean", "consensus_distance", "spectral_gap", "clients"):
        assert [r[key] for r in resumed.history] == [r[key] for r in full.history]
    assert len({r["spectral_gap"] for r in full.history}) > 1  # the graph was re-drawn every round


def test_two_processes_equal_one_process(tmp_path):
    overrides = dict(fed_algorithm="dfedgam", topology="exponential", clients_per_round=5, save_every_n_rounds=3)
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
               str(ROOT / "accelerate_configs" / "cpu_2proc.yaml"), "--main_process_port", "0",
               str(ROOT / "tests" / "scripts" / "tiny_decentralized_run.py")]
    for key, value in settings(tmp_path / "two", **overrides).items():
        command += [f"--{key}", str(value).lower() if isinstance(value, bool) else str(value)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    launched = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    one, one_out = run(tmp_path / "one", model_seed=7, **overrides)  # while the launch runs
    stdout, stderr = launched.communicate(timeout=600)
    assert launched.returncode == 0, stdout[-3000:] + stderr[-3000:]
    two = load_file(str(tmp_path / "two" / "final_params.safetensors"))
    with safe_open(str(tmp_path / "two" / "final_params.safetensors"), "pt") as handle:
        assert handle.metadata()["world_size"] == "2"
    assert (two["params"] - one_out.params).abs().max().item() <= 1e-5
    for c in range(6):
        assert (two[f"client-{c}"] - one.local_model(c)["params"]).abs().max().item() <= 1e-5
    history_two = json.loads((tmp_path / "two" / "history.json").read_text())
    assert [r["clients"] for r in history_two] == [r["clients"] for r in one.history]
    distances = [r["consensus_distance"] for r in one.history]
    assert [r["consensus_distance"] for r in history_two] == pytest.approx(distances)
    assert len(list((tmp_path / "two" / "checkpoints" / "round-3" / "client_states").iterdir())) == 6


class TinyBatchNormClassifier(TinyClassifier):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.BatchNorm1d(5), torch.nn.Tanh(),
                                       torch.nn.Linear(5, 3))


def test_batchnorm_statistics_gossip_with_the_weights(tmp_path):
    class Capture(FederatedCallback):
        def on_aggregate(self, trainer, round_index, updates, **kwargs):
            self.buffers = torch.stack([u.buffers for u in updates])

    capture = Capture()
    args = FedTrainingArguments(**settings(tmp_path, num_clients=3, num_rounds=1, topology="full",
                                           decentralized_participation="full", batchnorm_buffers="average"))
    torch.manual_seed(0)
    trainer = DecentralizedTrainer(TinyBatchNormClassifier(), args, TRAIN, TEST, label_column="labels",
                                   callbacks=[capture])
    trainer.train()
    assert (capture.buffers[0] - capture.buffers[1]).abs().max() > 1e-4  # clients saw different statistics
    for client_id in range(3):
        torch.testing.assert_close(trainer.local_model(client_id)["buffers"], capture.buffers.mean(dim=0),
                                   rtol=0, atol=1e-6)
    torch.testing.assert_close(trainer.buffer_space.flatten(), capture.buffers.mean(dim=0), rtol=0, atol=1e-6)


def test_failed_clients_gossip_their_unchanged_model(tmp_path):
    torch.manual_seed(0)
    initial = torch.cat([p.detach().reshape(-1) for p in TinyClassifier().parameters()])
    args = FedTrainingArguments(**settings(tmp_path, num_rounds=1, max_update_norm=1e-9))
    torch.manual_seed(0)
    trainer = DecentralizedTrainer(TinyClassifier(), args, TRAIN, TEST, label_column="labels")
    with pytest.raises(TrainingFailedError, match="No round aggregated any client"):
        trainer.train()  # every update is "too large": nothing trained, so the run fails (no final model)
    record = trainer.history[0]
    assert record["num_clients"] == 0 and len(record["failed_clients"]) == 3 and "train_loss" not in record
    torch.testing.assert_close(local_models(trainer), initial.expand(6, -1), rtol=0, atol=1e-7)
