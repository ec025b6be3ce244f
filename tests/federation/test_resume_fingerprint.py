"""A resume may not change the run's math unrecorded: every setting that changes it (local work, batch, clipping,
optimizer, schedule, weight decay, the pieces' hyperparameters) is refused naming the field, or taken with
allow_config_change and recorded; the run's identity (algorithm, clients, seed, partition, data, model) is refused
even then; the command line adds its data and model arguments and exits with status 2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from hf_fedflat import FedTrainingArguments, FederatedTrainer, cli
from hf_fedflat.cli.exit_codes import EXIT_BAD_INPUT
from hf_fedflat.federation import CheckpointError
from hf_fedflat.federation.checkpoint import CorruptCheckpointError

from conftest import TinyClassifier, make_tiny_dataset
from helpers.runs import TEST, TRAIN

BASE = dict(use_cpu=True, fed_algorithm="fedsam", num_clients=6, clients_per_round=3, num_rounds=2, local_steps=2,
            per_device_train_batch_size=4, partition_scheme="iid", learning_rate=0.1, seed=7, save_every_n_rounds=1,
            disable_tqdm=True)


def train(output_dir, resume=None, model=None, train_dataset=TRAIN, **overrides):
    args = FedTrainingArguments(output_dir=str(output_dir), **{**BASE, **overrides})
    torch.manual_seed(0)
    trainer = FederatedTrainer(model or TinyClassifier(), args, train_dataset, TEST, label_column="labels")
    return trainer.train(resume_from_checkpoint=resume)


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("source") / "run"
    train(folder)
    return folder


def copy(source: Path, tmp_path: Path) -> Path:
    target = tmp_path / "run"
    shutil.copytree(source, target)
    return target


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != "run.lock"}


# (field, value given on resume, the checkpoint's value as recorded)
SETTINGS = [
    ("local_steps", 3, 2),
    ("local_epochs", 2.0, 1.0),
    ("per_device_train_batch_size", 8, 4),
    ("gradient_accumulation_steps", 2, 1),
    ("max_grad_norm", 1.0, 10.0),
    ("optim", "adamw_torch", "sgd"),
    ("optim_args", "momentum=0.9", None),
    ("adam_beta1", 0.5, 0.9),
    ("adam_epsilon", 1e-6, 1e-8),
    ("weight_decay", 0.01, 0.0),
    ("lr_scheduler_type", "linear", "constant"),
    # (warmup_steps alone cannot change here: the recorded constant schedule refuses a warm-up, see test_trainer_fields)
    ("dataloader_drop_last", True, False),
    ("aggregation_weights", "uniform", "samples"),
    ("rho", 0.1, 0.05),
]


@pytest.mark.parametrize("name, value, recorded", SETTINGS, ids=[s[0] for s in SETTINGS])
def test_a_changed_setting_is_refused_naming_it(tmp_path, source, name, value, recorded):
    folder = copy(source, tmp_path)
    before = snapshot(folder)
    with pytest.raises(CheckpointError, match=rf"^{name}: the checkpoint .*round-2 was made with {name}=") as refused:
        train(folder, resume="latest", num_rounds=3, **{name: value})
    assert "--allow_config_change true" in str(refused.value)
    assert not isinstance(refused.value, CorruptCheckpointError)  # never skipped by latest: it is the run's
    assert snapshot(folder) == before  # one run's files, as they were


@pytest.mark.parametrize("name, value, recorded", SETTINGS[:4], ids=[s[0] for s in SETTINGS[:4]])
def test_allow_config_change_takes_the_setting_and_records_it(tmp_path, source, name, value, recorded):
    folder = copy(source, tmp_path)
    output = train(folder, resume="latest", num_rounds=3, allow_config_change=True, **{name: value})
    change = next(c for c in output.history[1]["config_changes"] if c["field"] == name)
    assert change == {"field": name, "checkpoint": recorded, "run": value, "resumed_after_round": 2}
    meta = json.loads((folder / "checkpoints" / "round-3" / "federated_state.json").read_text())
    assert meta["fingerprint"][name] == value and change in meta["config_changes"]
    # the new value is now the checkpoint's: resuming with it again changes nothing
    again = train(folder, resume="latest", num_rounds=3, **{name: value})
    assert [r["round"] for r in again.history] == [1, 2, 3]


# (case, what the resume changes, the field named): refused even with allow_config_change
IDENTITY = [
    ("algorithm", dict(fed_algorithm="fedavg"), "fed_algorithm"),
    ("clients", dict(num_clients=8), "num_clients"),
    ("seed", dict(seed=8), "seed"),
    ("partition", dict(partition_scheme="dirichlet"), "partition_scheme"),
    ("partition seed", dict(partition_seed=3), "effective_partition_seed"),
    ("model", dict(model=TinyClassifier(hidden=6)), "num_parameters"),
    ("data size", dict(train_dataset=make_tiny_dataset(n=90, seed=1)), "train_rows"),
    ("data labels", dict(train_dataset=make_tiny_dataset(n=96, seed=5)), "partition_sha256"),
]


@pytest.mark.parametrize("case, changes, named", IDENTITY, ids=[i[0] for i in IDENTITY])
def test_the_run_s_identity_is_refused_even_with_allow_config_change(tmp_path, source, case, changes, named):
    folder = copy(source, tmp_path)
    before = snapshot(folder)
    with pytest.raises(CheckpointError, match=rf"^{named}: the checkpoint .*round-2 was made with {named}=") as refused:
        train(folder, resume="latest", num_rounds=3, allow_config_change=True, **changes)
    assert "not even --allow_config_change" in str(refused.value)
    assert snapshot(folder) == before


def test_the_command_line_refuses_a_changed_setting_or_data_argument_with_status_2(tmp_path, capsys):
    folder = tmp_path / "run"
    flags = ["train", "--dataset_name", "digits", "--image_size", "8", "--num_clients", "4", "--clients_per_round",
             "2", "--num_rounds", "1", "--local_steps", "1", "--per_device_train_batch_size", "8",
             "--save_every_n_rounds", "1", "--output_dir", str(folder), "--disable_tqdm", "true", "--use_cpu", "true"]
    assert cli.main(flags) == 0
    capsys.readouterr()
    before = snapshot(folder)
    for changed, named in ((["--max_grad_norm", "1.0"], "max_grad_norm"), (["--image_size", "16"], "image_size")):
        argv = [*flags, "--num_rounds", "2", "--resume_from_checkpoint", "latest", *changed]
        assert cli.main(argv) == EXIT_BAD_INPUT
        error = capsys.readouterr().err.strip().splitlines()[-1]
        assert error.startswith(f"hf-fedflat train: error: {named}: the checkpoint ")
        assert snapshot(folder) == before
