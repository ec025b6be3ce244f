"""Restored state is checked against the run, not against its manifest: a checkpoint whose manifest was rewritten to
fit tampered files (forged) is refused naming the file and tensor when a client state, the server state or the
global weights differ from what the run's own pieces and model keep (keys, shapes, dtypes, finite). A piece whose
new client state differs from the keys it declares stops the run at once."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from hf_fedflat import FedTrainingArguments
from hf_fedflat.corrections.scaffold import ScaffoldCorrection
from hf_fedflat.federation.checkpoint import CorruptCheckpointError, write_manifest
from hf_fedflat.federation.trainer_factory import trainer_class_for

from conftest import TinyClassifier
from helpers.runs import TEST, TRAIN

COMMON = dict(use_cpu=True, num_clients=6, clients_per_round=3, num_rounds=2, local_steps=2,
              per_device_train_batch_size=4, partition_scheme="iid", learning_rate=0.1, seed=7, save_every_n_rounds=1,
              disable_tqdm=True)
RUNS = {"scaffold": dict(fed_algorithm="scaffold"), "dfedavg": dict(fed_algorithm="dfedavg", topology="ring")}


def trainer(output_dir, run, **overrides):
    args = FedTrainingArguments(output_dir=str(output_dir), **{**COMMON, **RUNS[run], **overrides})
    torch.manual_seed(0)
    return trainer_class_for(args)(TinyClassifier(), args, TRAIN, TEST, label_column="labels")


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("sources")
    for run in RUNS:
        trainer(base / run, run).train()
    return {run: base / run for run in RUNS}


def every_client(change):
    """Rewrite every client's state file (consistently: only the run's template can tell), then the manifest."""
    def tamper(ck: Path) -> None:
        for path in sorted((ck / "client_states").iterdir()):
            save_file(change(load_file(str(path))), str(path))
    return tamper


def file(name, change):
    return lambda ck: save_file(change(load_file(str(ck / name))), str(ck / name))


def renamed(old, new):
    return lambda t: {(new if k == old else k): v for k, v in t.items()}


C = r"client_states/client-\d+\.safetensors"
# (case, run, tamper of round-2 (its manifest rewritten after), the message's file and tensor)
CASES = [
    ("client states of another dtype", "scaffold", every_client(lambda t: {k: v.double() for k, v in t.items()}),
     rf"{C}: tensor 'scaffold/c_i' is float64 of shape \[43\], this run's pieces keep float32 of shape \[43\]"),
    ("client states of another shape", "scaffold", every_client(lambda t: {k: v[:40] for k, v in t.items()}),
     rf"{C}: tensor 'scaffold/c_i' is float32 of shape \[40\], this run's pieces keep float32 of shape \[43\]"),
    ("client states without their key", "scaffold", every_client(lambda t: {}),
     rf"{C}: tensor 'scaffold/c_i' is missing; this run's pieces keep it for every client with state"),
    ("client states under another key", "scaffold", every_client(renamed("scaffold/c_i", "scaffold/c")),
     rf"{C}: tensor 'scaffold/c' is kept by no piece of this run"),
    ("client states with a key of no piece", "scaffold",
     every_client(lambda t: {**t, "feddyn/h": torch.zeros(43)}), rf"{C}: tensor 'feddyn/h' is kept by no piece"),
    ("client states with a non-finite value", "scaffold",
     every_client(lambda t: {k: torch.full_like(v, float("inf")) for k, v in t.items()}),
     rf"{C}: tensor 'scaffold/c_i' has 43 NaN/Inf value"),
    ("own models of another shape", "dfedavg", every_client(lambda t: {k: v[:42] for k, v in t.items()}),
     r"client_states/client-0\.safetensors: tensor 'gossip/params' is float32 of shape \[42\]"),
    ("own models missing", "dfedavg", every_client(renamed("gossip/params", "gossip/model")),
     r"client_states/client-0\.safetensors: tensor 'gossip/model' is kept by no piece"),
    ("server state of another dtype", "scaffold",
     file("server_state.safetensors", lambda t: {k: v.half() for k, v in t.items()}),
     r"server_state\.safetensors: 'scaffold/c' is float16 of shape \[43\], this run's pieces keep float32"),
    ("global weights of another shape", "scaffold",
     file("global_params.safetensors", lambda t: {**t, "net.2.bias": torch.zeros(4)}),
     r"global_params\.safetensors: tensor 'net\.2\.bias' has shape \[4\], this model's is \[3\]"),
]


@pytest.mark.parametrize("case, run, tamper, message", CASES, ids=[c[0] for c in CASES])
def test_forged_state_is_refused_against_the_run_s_template(tmp_path, sources, case, run, tamper, message):
    folder = tmp_path / "run"
    shutil.copytree(sources[run], folder)
    checkpoint = folder / "checkpoints" / "round-2"
    tamper(checkpoint)
    write_manifest(checkpoint, 2)  # the manifest fits the tampered files
    with pytest.raises(CorruptCheckpointError, match=message) as refused:
        trainer(folder, run, num_rounds=3).train(resume_from_checkpoint=str(checkpoint))
    assert str(checkpoint) in str(refused.value)
    assert sorted(p.name for p in (folder / "checkpoints").iterdir()) == ["round-1", "round-2"]


def test_a_piece_returning_keys_it_does_not_declare_stops_the_run(tmp_path, monkeypatch):
    monkeypatch.setattr(ScaffoldCorrection, "client_state_keys", ("c_j",))
    with pytest.raises(RuntimeError, match=r"new state holds \['scaffold/c_i'\], the run's pieces declare "
                                           r"\['scaffold/c_j'\]"):
        trainer(tmp_path, "scaffold", num_rounds=1).train()
