"""What ``FederatedTrainer`` builds before the first round: a model with BatchNorm is refused unless its buffers
are averaged, and then they are averaged with the aggregation weights."""

from __future__ import annotations

import pytest
import torch

from hf_fedflat import FedTrainingArguments, FederatedTrainer

from conftest import TinyClassifier
from helpers.runs import TEST, TRAIN


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
