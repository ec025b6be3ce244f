"""The round loop on tiny data: history, outputs, determinism, resume, each client's data order, the history
file's writes."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from hf_fedflat import FederatedCallback, FedTrainingArguments, FederatedTrainer

from conftest import TinyClassifier
from helpers.runs import TEST, TRAIN, run


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


@pytest.mark.parametrize("algorithm", ["fedavg", "scaffold", "fedgamma", "fedlesam", "fedadam", "fedsmoo", "mofedsam", "fedup",
                                       "fedasam", "fedgmt", "fedwmsam"])
def test_resume_equals_uninterrupted(tmp_path, algorithm):
    """Stop after round 2 (checkpoint), resume in a fresh trainer: same final model, same history."""
    _, full = run(tmp_path / "full", fed_algorithm=algorithm)
    run(tmp_path / "cut", fed_algorithm=algorithm, num_rounds=2, save_every_n_rounds=1)
    # a fresh model init that differs: everything must come from the checkpoint
    trainer, resumed = run(tmp_path / "cut", fed_algorithm=algorithm, resume="latest", model_seed=123)
    torch.testing.assert_close(resumed.params, full.params, rtol=0, atol=0)
    assert [r["round"] for r in resumed.history] == [1, 2, 3, 4]
    assert [r["eval_loss"] for r in resumed.history] == [r["eval_loss"] for r in full.history]


def test_each_client_and_round_gets_its_own_data_order(tmp_path):
    """The Trainer's sampler is seeded from (seed, round, client) (a data_seed is refused: the federated loop
    would override it; see tests/test_trainer_fields.py)."""
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
