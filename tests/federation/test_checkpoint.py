"""Checkpoints: what one holds and how many are kept; tampered or incomplete ones are refused on resume with a
CheckpointError naming the file (and tensor or field); ``latest`` falls back past a corrupt newest checkpoint;
settings (and piece hyperparameters) a resume must not silently change.

The tampering cases' runs are built once per module (a scaffold run: server state and client states; a dfedavg
run: every client's own model in the client-state store); each case tampers with a copy. Cases marked "forged" also
rewrite ``manifest.json`` to fit the tampered files (as someone regenerating it would): the explicit checks
(finite, dtype, shape, server-state keys, round, client ids) must refuse them without the hashes' help.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from hf_fedflat import FedTrainingArguments
from hf_fedflat.federation.trainer_factory import trainer_class_for
from hf_fedflat.federation import list_checkpoints
from hf_fedflat.federation.checkpoint import (
    CheckpointError,
    CorruptCheckpointError,
    load_checkpoint,
    write_manifest,
)

from conftest import TinyClassifier, make_tiny_dataset
from helpers.runs import run as tiny_run

TRAIN = make_tiny_dataset(n=96, seed=1)
TEST = make_tiny_dataset(n=30, seed=2)
COMMON = dict(use_cpu=True, num_clients=6, clients_per_round=3, local_steps=2, per_device_train_batch_size=4,
              partition_scheme="iid", learning_rate=0.1, lr_decay_per_round=0.9, seed=7, disable_tqdm=True)
RUNS = {"scaffold": dict(fed_algorithm="scaffold", num_rounds=3),
        "dfedavg": dict(fed_algorithm="dfedavg", topology="ring", num_rounds=3)}


def make_trainer(output_dir, run: str = "scaffold", **overrides):
    args = FedTrainingArguments(output_dir=str(output_dir), **{**COMMON, **RUNS[run], **overrides})
    torch.manual_seed(123)  # another initial model: whatever resumes must come from the checkpoint
    return trainer_class_for(args)(TinyClassifier(), args, TRAIN, TEST, label_column="labels")


@dataclass
class Source:
    path: Path
    params: torch.Tensor  # the uninterrupted run's final model


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    base = tmp_path_factory.mktemp("sources")
    made = {}
    for run in RUNS:
        output = make_trainer(base / run, run, save_every_n_rounds=1).train()
        made[run] = Source(base / run, output.params.clone())
    return made


def snapshot(root: Path, exclude: Path | None = None) -> dict[str, str]:
    """``{relative path: sha256}`` of every file under ``root`` (symlinks by target), minus ``exclude``."""
    found = {}
    for dirpath, _, filenames in os.walk(root):
        if exclude is not None and Path(dirpath).is_relative_to(exclude):
            continue
        for name in filenames:
            path = Path(dirpath) / name
            content = os.readlink(path).encode() if path.is_symlink() else path.read_bytes()
            found[str(path.relative_to(root))] = hashlib.sha256(content).hexdigest()
    return found


# --- tampering ----------------------------------------------------------------------------------------------
def first_data_byte(path: Path, tensor: str) -> int:
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    return 8 + length + json.loads(raw[8:8 + length])[tensor]["data_offsets"][0]


def flip_exponent_bit(ck: Path) -> None:
    """The top exponent bit of net.0.weight[0] (float32, little endian: byte 3, bit 6): finite, ~1e38x off."""
    path = ck / "global_params.safetensors"
    raw = bytearray(path.read_bytes())
    position = first_data_byte(path, "net.0.weight") + 3
    raw[position] ^= 0x40
    path.write_bytes(bytes(raw))
    assert torch.isfinite(load_file(str(path))["net.0.weight"]).all()  # only the hash can tell


def rewrite(ck: Path, name: str, change) -> None:
    tensors = load_file(str(ck / name))
    save_file(change(tensors), str(ck / name))


def with_value(tensor: str, value: float):
    def change(tensors):
        tensors[tensor].view(-1)[0] = value
        return tensors
    return change


def as_dtype(dtype):
    return lambda tensors: {k: v.to(dtype) for k, v in tensors.items()}


def client_files(ck: Path) -> list[Path]:
    return sorted((ck / "client_states").iterdir())


def edit_state(ck: Path, change) -> None:
    path = ck / "federated_state.json"
    meta = json.loads(path.read_text())
    change(meta)
    path.write_text(json.dumps(meta))


def truncate(ck: Path) -> None:
    """The header and half the data, as a write cut short leaves it."""
    path = ck / "global_params.safetensors"
    start = first_data_byte(path, "net.0.weight")
    path.write_bytes(path.read_bytes()[: start + (path.stat().st_size - start) // 2])


def symlink_client(ck: Path) -> None:
    """A client's file replaced by a symlink to a copy outside the run folder (same bytes)."""
    victim = client_files(ck)[0]
    outside = ck.parents[2] / "outside" / victim.name
    shutil.copy(victim, outside)
    victim.unlink()
    victim.symlink_to(outside)


def stray_client(ck: Path) -> None:
    shutil.copy(client_files(ck)[0], ck / "client_states" / "client-999.safetensors")


def one_client(change):
    def tamper(ck: Path) -> None:
        victim = client_files(ck)[-1]
        tensors = load_file(str(victim))
        save_file(change(tensors), str(victim))
    return tamper


def server_state(change):
    return lambda ck: rewrite(ck, "server_state.safetensors", change)


def params(change):
    return lambda ck: rewrite(ck, "global_params.safetensors", change)


def forged(tamper, manifest_round: int = 3):
    """Tamper, then regenerate manifest.json so that it fits: only the explicit checks are left."""
    def apply(ck: Path) -> None:
        tamper(ck)
        write_manifest(ck, manifest_round)
    return apply


def set_round(value: int):
    return lambda ck: edit_state(ck, lambda meta: meta.update(round=value))


C = r"client_states/client-\d+\.safetensors"
SHA = "has a SHA-256 that differs from the one in manifest.json"
# (case, run, tamper of round-3, message naming the file and tensor/field)
CASES = [
    ("exponent bit flipped", "scaffold", flip_exponent_bit, rf"global_params\.safetensors {SHA}"),
    ("NaN in global params", "scaffold", params(with_value("net.0.weight", float("nan"))),
     rf"global_params\.safetensors {SHA}"),
    ("NaN in global params, forged", "scaffold", forged(params(with_value("net.0.weight", float("nan")))),
     r"global_params\.safetensors: tensor 'net\.0\.weight' has 1 NaN/Inf value"),
    ("Inf in global params, forged", "scaffold", forged(params(with_value("net.2.bias", float("inf")))),
     r"global_params\.safetensors: tensor 'net\.2\.bias' has 1 NaN/Inf value"),
    ("fp16 global params", "scaffold", params(as_dtype(torch.float16)),
     r"global_params\.safetensors has \d+ bytes, manifest\.json says \d+"),
    ("fp16 global params, forged", "scaffold", forged(params(as_dtype(torch.float16))),
     r"global_params\.safetensors: tensor 'net\.\d\.\w+' is float16, this run's is float32"),
    ("int64 global params, forged", "scaffold", forged(params(as_dtype(torch.int64))),
     r"global_params\.safetensors: tensor 'net\.\d\.\w+' is int64, this run's is float32"),
    ("reshaped global param, forged", "scaffold",
     forged(params(lambda t: {**t, "net.0.weight": t["net.0.weight"].reshape(-1)})),
     r"global_params\.safetensors: tensor 'net\.0\.weight' has shape \[20\], this model's is \[5, 4\]"),
    ("global param removed, forged", "scaffold",
     forged(params(lambda t: {k: v for k, v in t.items() if k != "net.2.bias"})),
     r"global_params\.safetensors: tensor 'net\.2\.bias' is missing"),
    ("wrong-shaped server state", "scaffold", server_state(lambda t: {"scaffold/c": torch.zeros(7)}),
     r"server_state\.safetensors has \d+ bytes"),
    ("wrong-shaped server state, forged", "scaffold", forged(server_state(lambda t: {"scaffold/c": torch.zeros(7)})),
     r"server_state\.safetensors: 'scaffold/c' is float32 of shape \[7\], this run's pieces keep float32 of "
     r"shape \[43\]"),
    ("fp16 server state, forged", "scaffold", forged(server_state(as_dtype(torch.float16))),
     r"server_state\.safetensors: 'scaffold/c' is float16 of shape \[43\]"),
    ("server state key missing", "scaffold", server_state(lambda t: {}), r"server_state\.safetensors has \d+ bytes"),
    ("server state key missing, forged", "scaffold", forged(server_state(lambda t: {})),
     r"server_state\.safetensors: 'scaffold/c' is missing; this run's pieces \(scaffold\) keep it"),
    ("unknown server state key, forged", "scaffold", forged(server_state(lambda t: {**t, "fedadam/v": torch.ones(43)})),
     r"server_state\.safetensors: 'fedadam/v' is kept by no piece of this run"),
    ("NaN in server state, forged", "scaffold", forged(server_state(with_value("scaffold/c", float("nan")))),
     r"server_state\.safetensors: tensor 'scaffold/c' has 1 NaN/Inf value"),
    ("client-state file deleted (SCAFFOLD c_i)", "scaffold", lambda ck: client_files(ck)[0].unlink(),
     rf"{C} is missing \(manifest\.json lists it"),
    ("client-state file deleted (own model)", "dfedavg", lambda ck: client_files(ck)[2].unlink(),
     r"client_states/client-2\.safetensors is missing \(manifest\.json lists it"),
    ("NaN in a client state", "scaffold", one_client(with_value("scaffold/c_i", float("nan"))), rf"{C} {SHA}"),
    ("NaN in a client state, forged", "scaffold", forged(one_client(with_value("scaffold/c_i", float("nan")))),
     rf"{C}: tensor 'scaffold/c_i' has 1 NaN/Inf value"),
    ("NaN in a client's own model, forged", "dfedavg", forged(one_client(with_value("gossip/params", float("nan")))),
     r"client_states/client-5\.safetensors: tensor 'gossip/params' has 1 NaN/Inf value"),
    ("fp16 client state, forged", "scaffold", forged(one_client(as_dtype(torch.float16))),
     rf"{C}: tensor 'scaffold/c_i' is float16 of shape \[43\], client \d+'s is float32"),
    ("stray client-999 file", "scaffold", stray_client,
     r"client_states/client-999\.safetensors is not part of the checkpoint \(manifest\.json does not list it\)"),
    ("stray client-999 file, forged", "scaffold", forged(stray_client),
     r"client_states/client-999\.safetensors client 999 does not exist in this run \(num_clients=6\)"),
    ("client file replaced by a symlink", "scaffold", symlink_client, rf"{C} is not a regular file"),
    ("fingerprint removed", "scaffold", lambda ck: edit_state(ck, lambda m: m.pop("fingerprint")),
     r"federated_state\.json has \d+ bytes, manifest\.json says"),
    ("fingerprint removed, forged", "scaffold", forged(lambda ck: edit_state(ck, lambda m: m.pop("fingerprint"))),
     r"federated_state\.json: field 'fingerprint' is missing"),
    ("fingerprint field removed, forged", "scaffold",
     forged(lambda ck: edit_state(ck, lambda m: m["fingerprint"].pop("scaffold_lambda"))),
     r"federated_state\.json: fingerprint lacks 'scaffold_lambda'"),
    ("manifest removed", "scaffold", lambda ck: (ck / "manifest.json").unlink(), r"manifest\.json is missing"),
    ("round edited to 99", "scaffold", set_round(99), r"federated_state\.json has \d+ bytes, manifest\.json says"),
    ("round edited to 99, forged", "scaffold", forged(set_round(99), manifest_round=99),
     r"federated_state\.json: field 'round' is 99, but the folder is round-3, manifest\.json says round 99 and the "
     r"history holds rounds \[1, 2, 3\]"),
    ("round edited to 0", "scaffold", set_round(0), r"federated_state\.json has \d+ bytes, manifest\.json says"),
    ("round edited to 0, forged", "scaffold", forged(set_round(0), manifest_round=0),
     r"federated_state\.json: field 'round' is 0; a checkpoint is written after round 1 or later"),
    ("history cut to 2 rounds, forged", "scaffold",
     forged(lambda ck: edit_state(ck, lambda m: m.update(history=m["history"][:2]))),
     r"federated_state\.json: field 'round' is 3, .* the history holds rounds \[1, 2\]"),
    ("global params truncated", "scaffold", truncate, r"global_params\.safetensors has \d+ bytes, manifest\.json says"),
    ("global params truncated, forged", "scaffold", forged(truncate),
     r"global_params\.safetensors cannot be read as safetensors"),
]


@pytest.mark.parametrize("case, run, tamper, message", CASES, ids=[c[0] for c in CASES])
def test_tampered_checkpoint_is_refused_naming_the_file(tmp_path, sources, case, run, tamper, message):
    source = sources[run]
    before_source = snapshot(source.path)
    run_dir = tmp_path / "run"
    shutil.copytree(source.path, run_dir, symlinks=True)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "keep.txt").write_text("not the run's")
    checkpoint = run_dir / "checkpoints" / "round-3"
    tamper(checkpoint)
    before = snapshot(tmp_path, exclude=run_dir)
    trainer = make_trainer(run_dir, run, num_rounds=4)
    with pytest.raises(CorruptCheckpointError, match=message) as refused:
        trainer.train(resume_from_checkpoint=str(checkpoint))
    assert str(checkpoint) in str(refused.value)
    assert trainer.history == [] and not (run_dir / "checkpoints" / "round-4").exists()
    assert snapshot(tmp_path, exclude=run_dir) == before  # nothing outside output_dir changed
    assert snapshot(source.path) == before_source


def copy_run(source: Source, tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    shutil.copytree(source.path, run_dir)
    return run_dir


def test_latest_skips_a_corrupt_newest_checkpoint_and_resumes_the_previous_one(tmp_path, sources, caplog):
    run_dir = copy_run(sources["scaffold"], tmp_path)
    flip_exponent_bit(run_dir / "checkpoints" / "round-3")
    with caplog.at_level(logging.WARNING, logger="hf_fedflat.federation.checkpoint"):
        output = make_trainer(run_dir, save_every_n_rounds=1).train(resume_from_checkpoint="latest")
    skipped = [r.getMessage() for r in caplog.records if "skipping round-3" in r.getMessage()]
    assert len(skipped) == 1 and f"global_params.safetensors {SHA}" in skipped[0]
    # round 3 trained again from round 2: the uninterrupted run's model, bit for bit; round-3 re-written intact
    torch.testing.assert_close(output.params, sources["scaffold"].params, rtol=0, atol=0)
    assert [r["round"] for r in output.history] == [1, 2, 3]
    assert load_checkpoint(run_dir / "checkpoints" / "round-3").round == 3


def test_latest_with_no_intact_checkpoint_lists_each(tmp_path, sources):
    run_dir = copy_run(sources["scaffold"], tmp_path)
    flip_exponent_bit(run_dir / "checkpoints" / "round-3")
    (run_dir / "checkpoints" / "round-2" / "manifest.json").unlink()
    truncate(run_dir / "checkpoints" / "round-1")
    with pytest.raises(CheckpointError, match="no intact checkpoint") as refused:
        make_trainer(run_dir).train(resume_from_checkpoint="latest")
    message = str(refused.value)
    assert f"round-3: Checkpoint {run_dir / 'checkpoints' / 'round-3'} is incomplete or corrupt: " \
           f"global_params.safetensors {SHA}" in message
    assert "round-2: " in message and "manifest.json is missing" in message
    assert "round-1: " in message and "global_params.safetensors has" in message


def test_a_settings_mismatch_is_not_skipped_by_latest(tmp_path, sources):
    """A fingerprint mismatch is about the run, not one checkpoint: refused at once, never falls back."""
    run_dir = copy_run(sources["scaffold"], tmp_path)
    with pytest.raises(CheckpointError, match=r"scaffold_lambda: the checkpoint .*round-3 was made with") as refused:
        make_trainer(run_dir, scaffold_lambda=0.5).train(resume_from_checkpoint="latest")
    assert not isinstance(refused.value, CorruptCheckpointError)


# --- settings a resume changes only explicitly ------------------------------------------------------------
GUARDED = [
    ("learning_rate", dict(learning_rate=0.05), "round-2",
     r"learning_rate: the checkpoint .*round-2 was made with learning_rate=0\.1, this run has 0\.05"),
    ("clients_per_round", dict(clients_per_round=2), "round-2",
     r"clients_per_round: the checkpoint .*round-2 was made with clients_per_round=3, this run has 2"),
    ("participation_fraction (same per-round count)", dict(clients_per_round=None, participation_fraction=0.34),
     "round-2", r"clients_per_round: .*clients_per_round=3, this run has 2"),
    ("lr_decay_per_round", dict(lr_decay_per_round=1.0), "round-2",
     r"lr_decay_per_round: the checkpoint .*round-2 was made with lr_decay_per_round=0\.9, this run has 1\.0"),
]


@pytest.mark.parametrize("case, overrides, checkpoint, message", GUARDED, ids=[g[0] for g in GUARDED])
def test_changed_settings_are_refused_without_allow_config_change(tmp_path, sources, case, overrides, checkpoint,
                                                                  message):
    run_dir = copy_run(sources["scaffold"], tmp_path)
    before = snapshot(run_dir / "checkpoints")
    with pytest.raises(CheckpointError, match=message) as refused:
        make_trainer(run_dir, **overrides).train(resume_from_checkpoint=str(run_dir / "checkpoints" / checkpoint))
    assert "--allow_config_change" in str(refused.value)
    assert snapshot(run_dir / "checkpoints") == before


def test_allowed_learning_rate_change_is_applied_and_recorded(tmp_path, sources, caplog):
    run_dir = copy_run(sources["scaffold"], tmp_path)
    with caplog.at_level(logging.WARNING, logger="hf_fedflat.federation.checkpoint"):
        output = make_trainer(run_dir, learning_rate=0.05, allow_config_change=True, save_every_n_rounds=1).train(
            resume_from_checkpoint=str(run_dir / "checkpoints" / "round-2"))
    change = {"field": "learning_rate", "checkpoint": 0.1, "run": 0.05, "resumed_after_round": 2}
    assert any("allow_config_change" in r.getMessage() and "learning_rate" in r.getMessage() for r in caplog.records)
    assert output.history[1]["config_changes"] == [change]
    assert output.history[2]["learning_rate"] == pytest.approx(0.05 * 0.9**2)  # round 3 used the new rate
    assert json.loads((run_dir / "history.json").read_text())[1]["config_changes"] == [change]
    meta = json.loads((run_dir / "checkpoints" / "round-3" / "federated_state.json").read_text())
    assert meta["config_changes"] == [change] and meta["settings"]["learning_rate"] == 0.05
    assert (output.params - sources["scaffold"].params).abs().max() > 0  # round 3 really trained at 0.05
    # the new rate is now the checkpoint's: resuming with it again is no change
    again = make_trainer(run_dir, learning_rate=0.05).train(resume_from_checkpoint="latest")
    assert [r["round"] for r in again.history] == [1, 2, 3]


@pytest.mark.parametrize("allow_config_change", [False, True])
def test_num_rounds_below_the_checkpoint_s_round_is_refused_even_with_allow_config_change(tmp_path, sources,
                                                                                         allow_config_change):
    run_dir = copy_run(sources["scaffold"], tmp_path)
    files = lambda: {k: v for k, v in snapshot(run_dir).items() if k != "run.lock"}  # noqa: E731 (the holder)
    before = files()
    with pytest.raises(CheckpointError) as refused:
        make_trainer(run_dir, num_rounds=2, allow_config_change=allow_config_change).train(
            resume_from_checkpoint="latest")
    assert str(refused.value) == (
        f"num_rounds: the checkpoint {run_dir / 'checkpoints' / 'round-3'} has completed 3 rounds, more than "
        "num_rounds=2; a run cannot end before a round it has trained. Resume with --num_rounds 3 or more, or resume "
        "the round-2 checkpoint (if kept) to end there.")
    assert files() == before  # the run's files as they were: history, status, final model, checkpoints


def test_an_accepted_change_is_in_history_json_even_when_no_round_follows(tmp_path, sources):
    run_dir = copy_run(sources["scaffold"], tmp_path)
    make_trainer(run_dir, learning_rate=0.05, allow_config_change=True).train(resume_from_checkpoint="latest")
    history = json.loads((run_dir / "history.json").read_text())
    assert [r["round"] for r in history] == [1, 2, 3]
    assert history[-1]["config_changes"] == [
        {"field": "learning_rate", "checkpoint": 0.1, "run": 0.05, "resumed_after_round": 3}]


def test_raising_num_rounds_extends_a_run_without_allow_config_change(tmp_path, sources):
    run_dir = copy_run(sources["dfedavg"], tmp_path)
    output = make_trainer(run_dir, "dfedavg", num_rounds=4).train(resume_from_checkpoint="latest")
    assert [r["round"] for r in output.history] == [1, 2, 3, 4]
    assert not any("config_changes" in r for r in output.history)


def test_manifest_lists_every_file_tensor_and_client(sources):
    for run, source in sources.items():
        checkpoint = source.path / "checkpoints" / "round-3"
        manifest = json.loads((checkpoint / "manifest.json").read_text())
        files = sorted(str(p.relative_to(checkpoint)) for p in checkpoint.rglob("*") if p.is_file())
        assert sorted(manifest["files"]) == [f for f in files if f != "manifest.json"]
        for rel, entry in manifest["files"].items():
            data = (checkpoint / rel).read_bytes()
            assert entry == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        assert manifest["tensors"]["global_params.safetensors"]["net.0.weight"] == {"dtype": "F32", "shape": [5, 4]}
        clients = sorted(int(p.stem.split("-")[1]) for p in (checkpoint / "client_states").iterdir())
        assert manifest["client_ids"] == clients and manifest["round"] == 3
        assert clients == (list(range(6)) if run == "dfedavg" else clients) and clients


def test_a_symlinked_checkpoints_folder_is_not_written_through(tmp_path):
    from hf_fedflat.io import UnsafeWritePathError

    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "checkpoints").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UnsafeWritePathError, match="checkpoints"):
        make_trainer(tmp_path / "run", save_every_n_rounds=1).train()
    assert list((tmp_path / "elsewhere").iterdir()) == []


# --- what a checkpoint holds, and resumes refused (the tiny run of helpers.runs) ---------------------------
def test_checkpoint_contents_and_total_limit(tmp_path):
    trainer, _ = tiny_run(tmp_path, fed_algorithm="scaffold", save_every_n_rounds=1, save_total_limit=2)
    checkpoints = list_checkpoints(tmp_path / "checkpoints")
    assert [p.name for p in checkpoints] == ["round-3", "round-4"]
    latest = checkpoints[-1]
    assert (latest / "server_state.safetensors").exists()
    assert "scaffold/c" in load_file(str(latest / "server_state.safetensors"))
    client_files = sorted(p.name for p in (latest / "client_states").iterdir())
    assert client_files and all(name.startswith("client-") for name in client_files)
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".")]


def test_incomplete_checkpoint_is_rejected(tmp_path):
    tiny_run(tmp_path, fed_algorithm="scaffold", num_rounds=2, save_every_n_rounds=1)
    broken = tmp_path / "checkpoints" / "round-2"
    (broken / "federated_state.json").write_text("{ truncated")
    with pytest.raises(CheckpointError, match="incomplete or corrupt"):
        tiny_run(tmp_path, fed_algorithm="scaffold", resume=str(broken))
    (broken / "federated_state.json").unlink()
    with pytest.raises(CheckpointError, match="incomplete or corrupt"):
        tiny_run(tmp_path, fed_algorithm="scaffold", resume=str(broken))


def test_resume_with_other_settings_is_refused(tmp_path):
    tiny_run(tmp_path, fed_algorithm="scaffold", num_rounds=2, save_every_n_rounds=1)
    with pytest.raises(CheckpointError, match="num_clients"):
        tiny_run(tmp_path, fed_algorithm="scaffold", num_clients=8, resume="latest")


def test_resume_with_other_piece_hyperparameters_is_refused(tmp_path):
    """The fingerprint holds every hyperparameter the run's pieces declare (read from the registry)."""
    tiny_run(tmp_path, fed_algorithm="fedgamma", rho=0.1, num_rounds=2, save_every_n_rounds=1)
    with pytest.raises(CheckpointError, match="rho"):
        tiny_run(tmp_path, fed_algorithm="fedgamma", rho=0.2, num_rounds=3, resume="latest")
    with pytest.raises(CheckpointError, match="scaffold_lambda"):
        tiny_run(tmp_path, fed_algorithm="fedgamma", rho=0.1, scaffold_lambda=0.5, num_rounds=3, resume="latest")
    _, resumed = tiny_run(tmp_path, fed_algorithm="fedgamma", rho=0.1, num_rounds=3, resume="latest")
    assert [r["round"] for r in resumed.history] == [1, 2, 3]
