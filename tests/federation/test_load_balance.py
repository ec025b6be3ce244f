"""Splitting a round's clients across processes: the predicted work follows the Trainer's real schedule,
the cost model recovers known costs, the greedy split balances them and covers every client once."""

from __future__ import annotations

import itertools

import pytest
import torch

from hf_fedflat import FederatedCallback, FedTrainingArguments, FederatedTrainer
from hf_fedflat.federation import ClientCostModel, assign_to_processes, local_work

from conftest import TinyClassifier
from helpers.runs import TRAIN


class CountForwarded(FederatedCallback):
    """Samples each client's model forwarded while training (a forward hook on the model)."""

    def __init__(self, model):
        self.samples, self.current = {}, 0
        model.register_forward_hook(self.hook, with_kwargs=True)

    def hook(self, module, args, kwargs, output):
        if module.training:  # the Trainer calls model(**batch)
            self.current += len(kwargs["x"])

    def on_round_begin(self, trainer, round_index, clients, **kwargs):
        self.current = 0

    def on_client_end(self, trainer, round_index, update, **kwargs):
        self.samples[update.client_id] = (update.num_steps, self.current)
        self.current = 0


@pytest.mark.parametrize("overrides", [
    dict(local_steps=5),  # cycles through epochs; Dirichlet clients smaller and larger than a batch
    dict(local_steps=4, gradient_accumulation_steps=3),  # an optimizer step takes 3 batches, fewer at epoch end
    dict(local_epochs=1.5, gradient_accumulation_steps=2),  # ceil(1.5 * steps per epoch)
    dict(local_epochs=2.0, dataloader_drop_last=True),
])
def test_local_work_is_what_the_client_trainer_does(tmp_path, overrides):
    args = FedTrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, fed_algorithm="fedavg", num_clients=8, clients_per_round=8,
        num_rounds=1, per_device_train_batch_size=5, partition_scheme="dirichlet", dirichlet_alpha=0.5,
        min_partition_size=2, learning_rate=0.1, seed=3, **overrides,
    )
    model = TinyClassifier()
    count = CountForwarded(model)
    trainer = FederatedTrainer(model, args, TRAIN, None, label_column="labels", callbacks=[count])
    trainer.train()
    sizes = trainer.client_sizes
    assert len(set(sizes)) > 2 and min(sizes) < 5 < max(sizes)  # the schedule's cases are all exercised
    # with drop_last a client smaller than a batch has no batch: no work predicted, and it trains none
    predicted = {c: trainer.local_work(c) for c in range(8)}
    assert count.samples == {c: work for c, work in predicted.items() if work != (0, 0)}
    assert len(count.samples) >= 6


def test_local_work_by_hand():
    # 13 rows, batches 4,4,4,1; 2 batches per step -> 2 steps per epoch; 5 steps = 2 epochs + 1 step
    assert local_work(13, 4, local_steps=5, gradient_accumulation_steps=2) == (5, 2 * 13 + 8)
    # drop_last: batches 4,4,4 -> steps of 2 and 1 batches; 5 steps = 2 epochs + 1 step of 2 batches
    assert local_work(13, 4, local_steps=5, gradient_accumulation_steps=2, drop_last=True) == (5, 2 * 12 + 8)
    assert local_work(3, 4, local_steps=6) == (6, 18)  # smaller than a batch: each step is one short epoch
    assert local_work(13, 4, local_epochs=0.5) == (2, 8)
    assert local_work(3, 4, local_steps=6, drop_last=True) == (0, 0)


def test_cost_model_recovers_known_costs_and_starts_from_samples():
    model = ClientCostModel()
    assert model.coefficients is None and model.cost(20, 300) == 300.0
    truth = (0.01, 0.004, 0.0003)  # per client, per step, per sample
    for steps, samples in itertools.product((5, 10, 20), (20, 80, 200, 320)):
        model.observe(steps, samples, truth[0] + truth[1] * steps + truth[2] * samples)
    assert model.coefficients == pytest.approx(truth, rel=1e-6)
    assert model.cost(15, 100) == pytest.approx(0.01 + 0.06 + 0.03)
    model.observe(1, 1, float("nan"))  # a failed timing is ignored
    assert model.coefficients == pytest.approx(truth, rel=1e-6)


def test_cost_model_coefficients_stay_non_negative():
    model = ClientCostModel()
    for steps, samples in ((10, 20), (10, 100), (10, 200), (10, 300), (10, 50)):
        model.observe(steps, samples, 0.5 - 0.001 * samples)  # more samples, *less* time: noise, not physics
    assert all(x >= 0 for x in model.coefficients)


def test_assignment_balances_costs_not_sample_counts():
    # equal work (fixed local steps, every client at least a batch) but very unequal sizes: 5 and 5
    costs = {c: 1.0 for c in range(10)}
    shares = assign_to_processes(list(range(10)), costs, 2)
    assert sorted(itertools.chain(*shares)) == list(range(10)) and [len(s) for s in shares] == [5, 5]
    # unequal work: the greedy split is within the largest cost of the best split
    costs = {c: float(w) for c, w in enumerate([9, 7, 6, 5, 5, 4, 3, 2, 2, 1])}
    shares = assign_to_processes(list(costs), costs, 3)
    loads = [sum(costs[c] for c in share) for share in shares]
    assert sorted(itertools.chain(*shares)) == list(range(10))
    assert max(loads) - min(loads) <= max(costs.values()) and max(loads) <= sum(costs.values()) / 3 + 2
    assert shares == assign_to_processes(list(costs), costs, 3)  # deterministic
    assert assign_to_processes([4, 2], costs, 4) == [[2], [4], [], []]  # costlier first, to the emptiest


def test_client_times_are_recorded_and_fit(tmp_path):
    args = FedTrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, fed_algorithm="fedavg", num_clients=6, clients_per_round=3,
        num_rounds=2, local_steps=2, per_device_train_batch_size=4, partition_scheme="iid", learning_rate=0.1,
    )
    seen = []

    class Times(FederatedCallback):
        def on_client_end(self, trainer, round_index, update, **kwargs):
            seen.append(update.train_seconds)

    torch.manual_seed(0)
    trainer = FederatedTrainer(TinyClassifier(), args, TRAIN, None, label_column="labels", callbacks=[Times()])
    trainer.train()
    assert len(seen) == 6 and all(0 < s < 60 for s in seen)
    assert trainer.cost_model.coefficients is not None  # 6 timed clients: the split of later rounds uses them
