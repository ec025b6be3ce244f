"""What a run reports besides its history: the partition files and the model card (callbacks every trainer
adds), and one ``report_to`` point per round."""

from __future__ import annotations

from hf_fedflat import FedTrainingArguments, FederatedTrainer

from conftest import TinyClassifier
from helpers.runs import TEST, TRAIN, run


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


def test_the_run_writes_partition_files_and_the_model_card_through_callbacks(tmp_path):
    from hf_fedflat.federation import PartitionFilesCallback
    from hf_fedflat.federation.start_summary import StartSummaryCallback
    from hf_fedflat.hub import ModelCardCallback

    args = FedTrainingArguments(output_dir=str(tmp_path), use_cpu=True, num_clients=2, clients_per_round=2,
                                num_rounds=1, local_steps=1, partition_scheme="iid", per_device_train_batch_size=8)
    trainer = FederatedTrainer(TinyClassifier(), args, TRAIN, TEST, label_column="labels")
    assert [type(c) for c in trainer.callbacks] == [StartSummaryCallback, PartitionFilesCallback, ModelCardCallback]
    trainer.callbacks = []  # without them, neither file is written
    trainer.train()
    assert not (tmp_path / "partition.json").exists() and not (tmp_path / "final_model" / "README.md").exists()
    assert (tmp_path / "final_model" / "federated_config.json").exists()
