"""End-to-end runs of the round loop on tiny data: history, outputs, determinism, resume."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file

from hf_fedflat import FederatedCallback, FedTrainingArguments, FederatedTrainer
from hf_fedflat.federation import list_checkpoints
from hf_fedflat.federation.checkpoint import CheckpointError

from conftest import TinyClassifier, make_tiny_dataset

TRAIN = make_tiny_dataset(n=96, seed=1)
TEST = make_tiny_dataset(n=30, seed=2)


def run(output_dir, *, resume=None, model_seed=0, callbacks=None, **overrides):
    settings = dict(
        output_dir=str(output_dir), use_cpu=True, fed_algorithm="fedgamma", num_clients=6, clients_per_round=3,
        num_rounds=4, local_steps=2, per_device_train_batch_size=4, partition_scheme="iid", learning_rate=0.1,
        lr_decay_per_round=0.9, seed=7,
    )
    settings.update(overrides)
    args = FedTrainingArguments(**settings)
    torch.manual_seed(model_seed)
    trainer = FederatedTrainer(TinyClassifier(), args, TRAIN, TEST, label_column="labels", callbacks=callbacks)
    return trainer, trainer.train(resume_from_checkpoint=resume)


def test_history_outputs_and_learning(tmp_path):
    trainer, output = run(tmp_path, fed_algorithm="fedavg", num_rounds=5, local_steps=4)
    history = json.loads((tmp_path / "history.json").read_text())
    assert [r["round"] for r in history] == [1, 2, 3, 4, 5]
    for record in history:
        for key in ("eval_loss", "eval_accuracy", "train_loss", "num_clients", "wall_seconds", "learning_rate"):
            assert key in record
        assert record["num_clients"] == 3
    assert history[-1]["learning_rate"] == pytest.approx(0.1 * 0.9**4)
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    final = tmp_path / "final_model"
    assert (final / "model.safetensors").exists() and not list(final.glob("*.bin"))
    saved = load_file(str(final / "model.safetensors"))
    flat = torch.cat([saved[name].reshape(-1) for name in trainer.space.names])
    torch.testing.assert_close(flat, output.params, rtol=0, atol=0)
    assert json.loads((final / "federated_config.json").read_text())["algorithm"]["aggregator"] == "mean"
    partition = json.loads((tmp_path / "partition.json").read_text())
    assert sum(sum(row) for row in partition["label_counts"]) == len(TRAIN)
    assert (tmp_path / "partition_heatmap.png").stat().st_size > 1000


def test_report_to_tensorboard_gets_one_point_per_round(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run(tmp_path, fed_algorithm="fedavg", num_rounds=3, report_to="tensorboard")
    event_dirs = {p.parent for p in tmp_path.rglob("events.out.tfevents.*")}
    assert len(event_dirs) == 1
    events = EventAccumulator(str(event_dirs.pop()))
    events.Reload()
    steps = [e.step for e in events.Scalars("eval/accuracy")]
    assert steps == [1, 2, 3]
    assert [e.step for e in events.Scalars("train/train_loss")] == [1, 2, 3]


def test_same_seed_same_model_different_seed_different_model(tmp_path):
    _, first = run(tmp_path / "a")
    _, second = run(tmp_path / "b")
    _, other = run(tmp_path / "c", seed=8)
    torch.testing.assert_close(first.params, second.params, rtol=0, atol=0)
    assert (first.params - other.params).abs().max() > 1e-4


def test_clients_train_different_data_each_round(tmp_path):
    trainer, _ = run(tmp_path, num_rounds=3)
    picked = [tuple(r["clients"]) for r in trainer.history]
    assert len(set(picked)) > 1  # seeded sampling varies across rounds


@pytest.mark.parametrize("algorithm", ["fedavg", "scaffold", "fedgamma", "fedlesam", "fedadam", "fedsmoo", "mofedsam", "fedup"])
def test_resume_equals_uninterrupted(tmp_path, algorithm):
    """Stop after round 2 (checkpoint), resume in a fresh trainer: same final model, same history."""
    _, full = run(tmp_path / "full", fed_algorithm=algorithm)
    run(tmp_path / "cut", fed_algorithm=algorithm, num_rounds=2, save_every_n_rounds=1)
    # a fresh model init that differs: everything must come from the checkpoint
    trainer, resumed = run(tmp_path / "cut", fed_algorithm=algorithm, resume="latest", model_seed=123)
    torch.testing.assert_close(resumed.params, full.params, rtol=0, atol=0)
    assert [r["round"] for r in resumed.history] == [1, 2, 3, 4]
    assert [r["eval_loss"] for r in resumed.history] == [r["eval_loss"] for r in full.history]


def test_checkpoint_contents_and_total_limit(tmp_path):
    trainer, _ = run(tmp_path, fed_algorithm="scaffold", save_every_n_rounds=1, save_total_limit=2)
    checkpoints = list_checkpoints(tmp_path / "checkpoints")
    assert [p.name for p in checkpoints] == ["round-3", "round-4"]
    latest = checkpoints[-1]
    assert (latest / "server_state.safetensors").exists()
    assert "scaffold/c" in load_file(str(latest / "server_state.safetensors"))
    client_files = sorted(p.name for p in (latest / "client_states").iterdir())
    assert client_files and all(name.startswith("client-") for name in client_files)
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".")]


def test_incomplete_checkpoint_is_rejected(tmp_path):
    run(tmp_path, fed_algorithm="scaffold", num_rounds=2, save_every_n_rounds=1)
    broken = tmp_path / "checkpoints" / "round-2"
    (broken / "federated_state.json").write_text("{ truncated")
    with pytest.raises(CheckpointError, match="incomplete or corrupt"):
        run(tmp_path, fed_algorithm="scaffold", resume=str(broken))
    (broken / "federated_state.json").unlink()
    with pytest.raises(CheckpointError, match="incomplete or corrupt"):
        run(tmp_path, fed_algorithm="scaffold", resume=str(broken))


def test_resume_with_other_settings_is_refused(tmp_path):
    run(tmp_path, fed_algorithm="scaffold", num_rounds=2, save_every_n_rounds=1)
    with pytest.raises(CheckpointError, match="num_clients"):
        run(tmp_path, fed_algorithm="scaffold", num_clients=8, resume="latest")


def test_resume_with_other_piece_hyperparameters_is_refused(tmp_path):
    """The fingerprint holds every hyperparameter the run's pieces declare (read from the registry)."""
    run(tmp_path, fed_algorithm="fedgamma", rho=0.1, num_rounds=2, save_every_n_rounds=1)
    with pytest.raises(CheckpointError, match="rho"):
        run(tmp_path, fed_algorithm="fedgamma", rho=0.2, num_rounds=3, resume="latest")
    with pytest.raises(CheckpointError, match="scaffold_lambda"):
        run(tmp_path, fed_algorithm="fedgamma", rho=0.1, scaffold_lambda=0.5, num_rounds=3, resume="latest")
    _, resumed = run(tmp_path, fed_algorithm="fedgamma", rho=0.1, num_rounds=3, resume="latest")
    assert [r["round"] for r in resumed.history] == [1, 2, 3]


class TinyBatchNormClassifier(TinyClassifier):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.BatchNorm1d(5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def test_batchnorm_model_is_refused_by_default(tmp_path):
    args = FedTrainingArguments(output_dir=str(tmp_path), use_cpu=True, num_clients=4, clients_per_round=2,
                                partition_scheme="iid")
    with pytest.raises(ValueError, match="batchnorm_buffers"):
        FederatedTrainer(TinyBatchNormClassifier(), args, TRAIN, TEST, label_column="labels")


def test_batchnorm_statistics_are_averaged_with_the_aggregation_weights(tmp_path):
    from hf_fedflat import FederatedCallback

    class Capture(FederatedCallback):
        def __init__(self):
            self.updates = []

        def on_aggregate(self, trainer, round_index, updates, **kwargs):
            self.updates = updates

    capture = Capture()
    args = FedTrainingArguments(output_dir=str(tmp_path), use_cpu=True, num_clients=3, clients_per_round=3,
                                num_rounds=1, local_steps=2, per_device_train_batch_size=4, partition_scheme="dirichlet",
                                dirichlet_alpha=0.5, min_partition_size=8, batchnorm_buffers="average")
    torch.manual_seed(0)
    model = TinyBatchNormClassifier()
    trainer = FederatedTrainer(model, args, TRAIN, TEST, label_column="labels", callbacks=[capture])
    trainer.train()
    sizes = torch.tensor([u.num_samples for u in capture.updates], dtype=torch.float64)
    weights = sizes / sizes.sum()
    expected = sum(w * u.buffers for w, u in zip(weights.tolist(), capture.updates))
    assert len({u.num_samples for u in capture.updates}) > 1  # unequal weights: the check has teeth
    torch.testing.assert_close(trainer.buffer_space.flatten(), expected, rtol=0, atol=1e-6)
    bn = model.net[1]
    assert not torch.equal(bn.running_mean, torch.zeros(5))


def test_each_client_and_round_gets_its_own_data_order(tmp_path):
    """The Trainer's sampler is seeded from (seed, round, client) (a data_seed is refused: the federated loop
    would override it; see tests/test_field_validation.py)."""
    from transformers import set_seed

    from hf_fedflat.sampling import derive_seed

    args = FedTrainingArguments(output_dir=str(tmp_path), use_cpu=True, num_clients=2, clients_per_round=2,
                                partition_scheme="iid", per_device_train_batch_size=8)
    trainer = FederatedTrainer(TinyClassifier(), args, TRAIN, TEST, label_column="labels").client_trainer
    trainer.train_dataset = TRAIN

    def first_batch(seed):
        set_seed(seed)
        loader = trainer.accelerator.prepare(trainer.get_train_dataloader())
        return next(iter(loader))["labels"].tolist(), next(iter(loader))["x"][0].tolist()

    assert first_batch(derive_seed(7, 0, 1)) == first_batch(derive_seed(7, 0, 1))
    assert first_batch(derive_seed(7, 0, 1)) != first_batch(derive_seed(7, 0, 2))
    assert first_batch(derive_seed(7, 0, 1)) != first_batch(derive_seed(7, 1, 1))


# --- the loop's shape ------------------------------------------------------------------------------------
def test_the_loop_is_short_and_both_modes_are_strategies_of_one_protocol():
    """Server FL and decentralized FL differ only in their Strategy: the same public methods, and the
    decentralized trainer overrides none of the federated trainer's methods (it adds accessors)."""
    import inspect

    from hf_fedflat import DecentralizedTrainer
    from hf_fedflat.decentralized import GossipStrategy
    from hf_fedflat.federation import ServerStrategy, Strategy, loop

    assert len(inspect.getsource(loop).splitlines()) < 250
    protocol = {name for name, _ in inspect.getmembers(Strategy, inspect.isfunction) if not name.startswith("_")}
    assert {"start", "sample", "send", "client_start", "apply", "model", "server_state"} <= protocol
    for strategy in (ServerStrategy, GossipStrategy):
        for name in protocol:
            expected = list(inspect.signature(getattr(Strategy, name)).parameters)
            assert list(inspect.signature(getattr(strategy, name)).parameters) == expected, (strategy, name)
    overridden = {name for name in vars(DecentralizedTrainer) if name in vars(FederatedTrainer)} - {"__init__", "__doc__",
                                                                                                     "__module__"}
    assert overridden == {"supports_decentralized"}


def test_the_run_writes_partition_files_and_the_model_card_through_callbacks(tmp_path):
    from hf_fedflat.federation import PartitionFilesCallback
    from hf_fedflat.hub import ModelCardCallback

    args = FedTrainingArguments(output_dir=str(tmp_path), use_cpu=True, num_clients=2, clients_per_round=2,
                                num_rounds=1, local_steps=1, partition_scheme="iid", per_device_train_batch_size=8)
    trainer = FederatedTrainer(TinyClassifier(), args, TRAIN, TEST, label_column="labels")
    assert [type(c) for c in trainer.callbacks] == [PartitionFilesCallback, ModelCardCallback]
    trainer.callbacks = []  # without them, neither file is written
    trainer.train()
    assert not (tmp_path / "partition.json").exists() and not (tmp_path / "final_model" / "README.md").exists()
    assert (tmp_path / "final_model" / "federated_config.json").exists()


class HistoryFileReader(FederatedCallback):
    """What ``history.json`` holds at each round's end (its rounds), and a failure at round ``fail_at``."""

    def __init__(self, path, fail_at=None):
        self.path, self.fail_at, self.seen = path, fail_at, []

    def on_round_end(self, trainer, round_index, record, **kwargs):
        self.seen.append([r["round"] for r in json.loads(self.path.read_text())] if self.path.exists() else None)
        if round_index + 1 == self.fail_at:
            raise RuntimeError("stop here")


def test_history_file_is_throttled_between_rounds_that_need_it_and_complete_at_every_exit(tmp_path, monkeypatch):
    import hf_fedflat.federation.loop as loop

    monkeypatch.setattr(loop, "HISTORY_INTERVAL", 1e9)  # no round is a second after the last write
    reader = HistoryFileReader(tmp_path / "history.json")
    _, output = run(tmp_path, fed_algorithm="fedavg", num_rounds=6, local_steps=1, save_every_n_rounds=3,
                    callbacks=[reader])
    # written after the first round, the checkpointed third and the last; complete at the end
    assert reader.seen == [[1], [1], [1, 2, 3], [1, 2, 3], [1, 2, 3], [1, 2, 3, 4, 5, 6]]
    assert json.loads((tmp_path / "history.json").read_text()) == json.loads(json.dumps(output.history, default=str))
    # a run that raises: the rounds recorded so far are written on the way out
    failing = HistoryFileReader(tmp_path / "failing" / "history.json", fail_at=4)
    with pytest.raises(RuntimeError, match="stop here"):
        run(tmp_path / "failing", fed_algorithm="fedavg", num_rounds=6, local_steps=1, callbacks=[failing])
    assert failing.seen == [[1], [1], [1], [1]]
    assert [r["round"] for r in json.loads((tmp_path / "failing" / "history.json").read_text())] == [1, 2, 3, 4]
    # with the interval passed, every round writes
    monkeypatch.setattr(loop, "HISTORY_INTERVAL", 0.0)
    every = HistoryFileReader(tmp_path / "every" / "history.json")
    run(tmp_path / "every", fed_algorithm="fedavg", num_rounds=3, local_steps=1, callbacks=[every])
    assert every.seen == [[1], [1, 2], [1, 2, 3]]
