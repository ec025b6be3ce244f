"""What ``FederatedTrainer`` builds before the first round: a model with BatchNorm is refused unless its buffers
are averaged, and then they are averaged with the aggregation weights; the local optimizer and rate left unset follow
the model it is given."""

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


def _sentiment_bert(tmp_path):
    import datasets
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from hf_fedflat.data.tiny_text import write_sentiment_data, write_tiny_model

    path = write_tiny_model(tmp_path / "bert", "bert")
    tokenizer = AutoTokenizer.from_pretrained(path)
    data = datasets.load_from_disk(write_sentiment_data(tmp_path / "data", train_rows=24, test_rows=8))
    data = data.map(lambda rows: tokenizer(rows["text"]), batched=True, remove_columns=["text"])
    return AutoModelForSequenceClassification.from_pretrained(path), data, tokenizer


@pytest.mark.parametrize("given,algorithm,expected", [
    ({}, "fedavg", ("adamw_torch", 5e-5)),                              # the Trainer's, as for --model_name_or_path
    ({"learning_rate": 1e-3}, "fedavg", ("adamw_torch", 1e-3)),         # a rate given is kept
    ({"optim": "sgd"}, "fedavg", ("sgd", 0.01)),                        # an optimizer given sets the rate's default
    ({}, "scaffold", ("sgd", 0.01)),                                    # plain SGD assumed by the algorithm
])
def test_a_transformers_model_built_in_python_gets_the_optimizer_a_transformers_user_expects(
        tmp_path, given, algorithm, expected):
    from transformers import DataCollatorWithPadding

    model, data, tokenizer = _sentiment_bert(tmp_path)
    args = FedTrainingArguments(output_dir=str(tmp_path / "run"), use_cpu=True, num_clients=2, clients_per_round=2,
                                partition_scheme="iid", fed_algorithm=algorithm, report_to="none", **given)
    FederatedTrainer(model, args, data["train"], data["test"], data_collator=DataCollatorWithPadding(tokenizer))
    assert (str(getattr(args.optim, "value", args.optim)), args.learning_rate) == expected


def test_a_built_in_model_built_in_python_keeps_the_papers_sgd(tmp_path):
    args = FedTrainingArguments(output_dir=str(tmp_path), use_cpu=True, num_clients=4, clients_per_round=2,
                                partition_scheme="iid")
    FederatedTrainer(TinyClassifier(), args, TRAIN, TEST, label_column="labels")
    assert (str(getattr(args.optim, "value", args.optim)), args.learning_rate) == ("sgd", 0.01)
