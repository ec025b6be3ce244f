"""Server FL and decentralized FL are two strategies of one protocol: the same public methods, a run that reads
from its strategy only that protocol (the same members in both modes), and a decentralized trainer that
overrides none of the federated trainer's methods (it adds accessors)."""

from __future__ import annotations

import inspect

import pytest

from hf_fedflat import DecentralizedTrainer, FedTrainingArguments, FederatedTrainer
from hf_fedflat.decentralized import GossipStrategy
from hf_fedflat.federation import ServerStrategy, Strategy

from conftest import TinyClassifier
from helpers.runs import TEST, TRAIN

METHODS = {name for name, _ in inspect.getmembers(Strategy, inspect.isfunction) if not name.startswith("_")}
PROTOCOL = METHODS | set(Strategy.__annotations__)  # the methods and the attributes (fingerprint)


def test_both_modes_are_strategies_of_one_protocol():
    assert {"start", "sample", "send", "client_start", "apply", "model", "server_state"} <= METHODS
    for strategy in (ServerStrategy, GossipStrategy):
        for name in METHODS:
            expected = list(inspect.signature(getattr(Strategy, name)).parameters)
            assert list(inspect.signature(getattr(strategy, name)).parameters) == expected, (strategy, name)
    overridden = {name for name in vars(DecentralizedTrainer) if name in vars(FederatedTrainer)} - {"__init__", "__doc__",
                                                                                                     "__module__"}
    assert overridden == {"supports_decentralized"}


class RecordingStrategy:
    """Stands in front of a run's strategy and records the name of every attribute the run reads from it."""

    def __init__(self, strategy):
        object.__setattr__(self, "_strategy", strategy)
        object.__setattr__(self, "read", set())

    def __getattr__(self, name):
        self.read.add(name)
        return getattr(self._strategy, name)

    def __setattr__(self, name, value):
        setattr(self._strategy, name, value)


@pytest.mark.parametrize("trainer_class, algorithm", [(FederatedTrainer, "fedavg"), (DecentralizedTrainer, "dfedavg")],
                         ids=["server", "decentralized"])
def test_a_run_talks_to_its_strategy_through_the_protocol_alone(tmp_path, trainer_class, algorithm):
    """Two rounds with a checkpoint each: the loop, the trainer and the checkpoints read every member of the
    protocol and nothing else, whichever the mode (nothing is specific to server or decentralized FL)."""
    args = FedTrainingArguments(output_dir=str(tmp_path), use_cpu=True, fed_algorithm=algorithm, num_clients=4,
                                clients_per_round=2, num_rounds=2, local_steps=1, per_device_train_batch_size=4,
                                partition_scheme="iid", save_every_n_rounds=1, disable_tqdm=True)
    trainer = trainer_class(TinyClassifier(), args, TRAIN, TEST, label_column="labels")
    recording = RecordingStrategy(trainer.strategy)
    trainer.strategy = recording
    output = trainer.train()
    assert [r["round"] for r in output.history] == [1, 2]
    assert recording.read == PROTOCOL
