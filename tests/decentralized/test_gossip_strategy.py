"""The decentralized round's local-model evaluation: which rounds (``local_eval_every_n_rounds``), which clients
(``local_eval_clients``, drawn from (seed, round)), the history rows, the consensus distance by hand, the checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hf_fedflat import DecentralizedTrainer, FedTrainingArguments

from conftest import TinyClassifier, make_tiny_dataset

TRAIN = make_tiny_dataset(n=96, seed=1)
TEST = make_tiny_dataset(n=30, seed=2)


def settings(output_dir, **overrides) -> dict:
    values = dict(output_dir=str(output_dir), use_cpu=True, fed_algorithm="dfedavg", num_clients=6,
                  clients_per_round=3, num_rounds=5, local_steps=1, per_device_train_batch_size=4,
                  partition_scheme="iid", learning_rate=0.1, seed=7, topology="ring", disable_tqdm=True,
                  decentralized_participation="sampled")
    values.update(overrides)
    return values


def trainer_for(output_dir, **overrides) -> DecentralizedTrainer:
    torch.manual_seed(0)
    return DecentralizedTrainer(TinyClassifier(), FedTrainingArguments(**settings(output_dir, **overrides)), TRAIN,
                                TEST, label_column="labels")


def test_thinned_local_evaluation_keeps_the_consensus_metrics_exact(tmp_path, one_thread):
    trainer = trainer_for(tmp_path, local_eval_every_n_rounds=2, local_eval_clients=4)
    output = trainer.train()
    history = trainer.history
    # the local models every 2nd round and at the last (5): rounds 2, 4, 5
    assert [r["round"] for r in history if "local_eval_accuracy_mean" in r] == [2, 4, 5]
    assert all("local_eval_clients" not in r for r in history if r["round"] in (1, 3))
    # the average model and the consensus distance every round
    assert all("eval_accuracy" in r and "consensus_distance" in r for r in history)
    models = torch.stack([trainer.local_model(c)["params"] for c in range(6)]).double()
    average = models.mean(dim=0)
    assert history[-1]["consensus_distance"] == pytest.approx((models - average).norm(dim=1).mean().item(), rel=1e-12)
    torch.testing.assert_close(output.params, average.float(), rtol=0, atol=0)
    # the last row's clients: 4 of 6, the ones the (seed, round) draw gives, their models' accuracies
    last = history[-1]
    assert last["local_eval_clients"] == trainer.local_eval_clients(4) and len(last["local_eval_clients"]) == 4
    accuracies = [trainer.evaluate(trainer.local_model(c)["params"])["eval_accuracy"] for c in last["local_eval_clients"]]
    assert last["local_eval_accuracy_mean"] == pytest.approx(np.mean(accuracies))
    assert last["local_eval_accuracy_std"] == pytest.approx(np.std(accuracies))


def test_sampled_clients_depend_on_seed_and_round_only(tmp_path):
    one = trainer_for(tmp_path / "one", local_eval_clients=3, num_rounds=40)
    again = trainer_for(tmp_path / "again", local_eval_clients=3, num_rounds=40)
    draws = [one.local_eval_clients(t) for t in range(40)]
    assert draws == [again.local_eval_clients(t) for t in range(40)]
    assert all(len(d) == 3 and d == sorted(set(d)) and set(d) <= set(range(6)) for d in draws)
    assert len({tuple(d) for d in draws}) > 1  # drawn anew each round
    other_seed = trainer_for(tmp_path / "seed", local_eval_clients=3, num_rounds=40, seed=8)
    assert [other_seed.local_eval_clients(t) for t in range(40)] != draws
    # every client when asked for all of them (or more), none with 0; the default: all when N <= 20
    assert trainer_for(tmp_path / "all", local_eval_clients=9).local_eval_clients(0) == list(range(6))
    assert trainer_for(tmp_path / "none", local_eval_clients=0).local_eval_clients(4) == []
    assert trainer_for(tmp_path / "default").local_eval_clients(0) == list(range(6))


@pytest.mark.parametrize("overrides, message", [
    (dict(local_eval_clients=-1), "^local_eval_clients: must be an integer >= 0"),
    (dict(local_eval_clients=1.5), "^local_eval_clients: must be an integer"),
    (dict(local_eval_every_n_rounds=0), "^local_eval_every_n_rounds: must be an integer >= 1"),
    (dict(local_eval_every_n_rounds=3, eval_every_n_rounds=2), "^local_eval_every_n_rounds: must be a multiple of "),
    (dict(fed_algorithm="fedavg", topology=None, decentralized_participation=None, local_eval_clients=2),
     "local_eval_clients"),
])
def test_bad_values_name_the_field(tmp_path, overrides, message):
    values = settings(tmp_path, **overrides)
    values = {k: v for k, v in values.items() if v is not None}
    with pytest.raises(ValueError, match=message):
        args = FedTrainingArguments(**values)
        args.check_algorithm_settings()
