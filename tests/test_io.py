"""Writes into output_dir never follow a symbolic link; final_model/ is written whole or not at all (``hf_fedflat.io``).

A link planted in the run's folder (``partition.json -> <a file elsewhere>``, ``final_model -> <a folder
elsewhere>``) is refused with an error naming it, and the file it points to is unchanged (hashed before and
after). A save of ``final_model/`` that fails or is killed half-way leaves the previous one intact and no folder
that looks complete. (A push of a final model that fails its completion check: ``tests/hub/test_push.py``.)
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hf_fedflat import FedTrainingArguments, FederatedCallback, FederatedTrainer
from hf_fedflat.io import (
    COMPLETE_MARKER,
    IncompleteSaveError,
    UnsafeWritePathError,
    atomic_write_dir,
    atomic_write_json,
    check_write_path,
    verify_complete_dir,
)

from conftest import TinyClassifier, make_tiny_dataset
from helpers import REPO_ROOT

TRAIN = make_tiny_dataset(n=24, seed=1)
TEST = make_tiny_dataset(n=9, seed=2)


def args(output_dir, **overrides):
    settings = dict(output_dir=str(output_dir), use_cpu=True, fed_algorithm="fedavg", num_clients=3,
                    clients_per_round=3, num_rounds=1, local_steps=1, per_device_train_batch_size=4,
                    partition_scheme="iid", learning_rate=0.1, seed=3)
    settings.update(overrides)
    return FedTrainingArguments(**settings)


def trainer(output_dir, callbacks=None, **overrides):
    torch.manual_seed(0)
    return FederatedTrainer(TinyClassifier(), args(output_dir, **overrides), TRAIN, TEST, label_column="labels",
                            callbacks=callbacks)


def digest(root: Path) -> dict[str, str]:
    """SHA-256 of every file under ``root`` (the folder outside the run)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def outside(tmp_path):
    folder = tmp_path / "outside"
    (folder / "victim_dir").mkdir(parents=True)
    (folder / "victim.txt").write_text("precious\n")
    (folder / "victim_dir" / "config.json").write_text('{"precious": true}\n')
    return folder


# the planted link (path in output_dir -> target outside), the path the error names
PLANTED = [
    ("partition.json", "victim.txt", "partition.json"),
    ("partition_heatmap.png", "victim.txt", "partition_heatmap.png"),
    ("history.json", "victim.txt", "history.json"),
    ("final_model/config.json", "victim.txt", "final_model/config.json"),
    ("final_model", "victim_dir", "final_model"),
    ("checkpoints", "victim_dir", "checkpoints"),
    ("run_status.json", "victim.txt", "run_status.json"),
]


@pytest.mark.parametrize("link,target,named", PLANTED, ids=[p[0] for p in PLANTED])
def test_planted_symlink_refused_before_any_round(tmp_path, outside, link, target, named):
    run_dir = tmp_path / "run"
    (run_dir / link).parent.mkdir(parents=True, exist_ok=True)
    os.symlink(outside / target, run_dir / link)
    before = digest(outside)
    started = []

    class Rounds(FederatedCallback):
        def on_round_begin(self, trainer, *a, **k):
            started.append(1)

    with pytest.raises(UnsafeWritePathError) as error:
        trainer(run_dir, callbacks=[Rounds()], save_every_n_rounds=1).train()
    assert str(run_dir / named) in str(error.value) and "symbolic link" in str(error.value)
    assert started == []
    assert digest(outside) == before


def test_link_planted_during_the_run_refused_at_the_final_save(tmp_path, outside):
    """A link that appears after the set-up check: the write itself refuses it (final_model/ and history.json)."""
    run_dir = tmp_path / "run"
    before = digest(outside)

    class Plant(FederatedCallback):
        def on_round_end(self, trainer, round_index, record, **k):
            os.symlink(outside / "victim_dir", run_dir / "final_model")

    with pytest.raises(UnsafeWritePathError, match=rf"{run_dir / 'final_model'}: the file to write is a symbolic link"):
        trainer(run_dir, callbacks=[Plant()]).train()
    assert digest(outside) == before

    os.unlink(run_dir / "final_model")
    os.unlink(run_dir / "history.json")
    os.symlink(outside / "victim.txt", run_dir / "history.json")
    with pytest.raises(UnsafeWritePathError, match="history.json"):
        from hf_fedflat.io import RecordLog

        RecordLog(run_dir / "history.json").write([{"round": 1}])
    assert digest(outside) == before


def test_check_write_path_walks_the_folders_below_root(tmp_path, outside):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.symlink(outside / "victim_dir", run_dir / "sub")
    with pytest.raises(UnsafeWritePathError, match=rf"{run_dir / 'sub'}: a folder on the way to x.json"):
        atomic_write_json({"a": 1}, run_dir / "sub" / "x.json", root=run_dir)
    # the run's folder itself may be a link (a scratch disk): only what is below it is checked
    linked_run = tmp_path / "linked_run"
    os.symlink(run_dir, linked_run)
    atomic_write_json({"a": 1}, linked_run / "ok.json", root=linked_run)
    assert json.loads((run_dir / "ok.json").read_text()) == {"a": 1}
    assert check_write_path(linked_run / "ok.json", linked_run) == linked_run / "ok.json"
    assert digest(outside) == {"victim.txt": hashlib.sha256(b"precious\n").hexdigest(),
                               "victim_dir/config.json": hashlib.sha256(b'{"precious": true}\n').hexdigest()}


def test_final_model_has_a_completion_marker(tmp_path):
    t = trainer(tmp_path)
    output = t.train()
    final = Path(output.final_model_dir)
    manifest = verify_complete_dir(final)
    assert set(manifest["files"]) == {"model.safetensors", "federated_config.json"}
    data = (final / "model.safetensors").read_bytes()
    assert manifest["files"]["model.safetensors"] == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".final_model")]  # no temporary folder left
    # a truncated file no longer matches its marker
    (final / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(IncompleteSaveError, match="model.safetensors: size or SHA-256 differs"):
        verify_complete_dir(final)


def test_interrupted_final_save_keeps_the_previous_model(tmp_path, monkeypatch):
    t = trainer(tmp_path)
    t.train()
    final = tmp_path / "final_model"
    before = digest(final)
    from hf_fedflat.federation import trainer as trainer_module

    real = trainer_module.atomic_save_safetensors

    def fill_the_disk(tensors, path, *a, **k):
        real(tensors, path, *a, **k)  # the weights are written ...
        with open(os.path.join(os.path.dirname(path), "federated_config.json"), "w") as handle:
            handle.write('{"algo')  # ... then the disk fills halfway through the next file
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(trainer_module, "atomic_save_safetensors", fill_the_disk)
    with torch.no_grad():
        for p in t.model.parameters():
            p.add_(1.0)
    with pytest.raises(OSError, match="No space left on device"):
        t.save_model(str(final))
    assert digest(final) == before  # the previous final model, untouched and still complete
    verify_complete_dir(final)
    assert sorted(p.name for p in tmp_path.iterdir() if "final_model" in p.name) == ["final_model"]
    # without a previous one: no final_model/ at all
    with pytest.raises(OSError):
        t.save_model(str(tmp_path / "other_model"))
    assert not (tmp_path / "other_model").exists()
    monkeypatch.undo()
    t.save_model(str(final))  # a later save replaces it whole
    assert digest(final) != before and verify_complete_dir(final)


KILL_SCRIPT = r"""
import os, signal, sys
from hf_fedflat.io import atomic_write_dir

def save_half_then_die(folder):
    with open(os.path.join(folder, "config.json"), "w") as handle:
        handle.write('{"new": true}')
    with open(os.path.join(folder, "model.safetensors"), "wb") as handle:
        handle.write(b"half of the new weights")  # a truncated model.safetensors ...
    os.kill(os.getpid(), signal.SIGKILL)            # ... and the process killed

atomic_write_dir(sys.argv[1], save_half_then_die, root=os.path.dirname(sys.argv[1]))
"""


def test_killed_final_save_leaves_nothing_that_looks_complete(tmp_path):
    """SIGKILL while model.safetensors is half written (the save FederatedTrainer.save_model makes): the previous
    final_model/ is intact, the temporary folder has no marker, and the next save removes the leftover."""
    t = trainer(tmp_path)
    t.train()
    final = tmp_path / "final_model"
    before = digest(final)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run([sys.executable, "-c", KILL_SCRIPT, str(final)], capture_output=True, text=True,
                            timeout=120, env=env)
    assert result.returncode == -9, result.stderr[-2000:]
    assert digest(final) == before
    verify_complete_dir(final)
    leftovers = [p for p in tmp_path.iterdir() if p.name.startswith(".final_model.tmp-")]
    assert len(leftovers) == 1 and (leftovers[0] / "model.safetensors").read_bytes() == b"half of the new weights"
    with pytest.raises(IncompleteSaveError, match="hf_fedflat_complete.json: missing"):
        verify_complete_dir(leftovers[0])
    t.save_model(str(final))
    verify_complete_dir(final)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".final_model")]


def test_atomic_write_dir_refuses_a_linked_target_and_cleans_up(tmp_path, outside):
    os.symlink(outside / "victim_dir", tmp_path / "model")
    before = digest(outside)
    with pytest.raises(UnsafeWritePathError, match="model: the file to write is a symbolic link"):
        atomic_write_dir(tmp_path / "model", lambda d: Path(d, "config.json").write_text("{}"), root=tmp_path)
    assert digest(outside) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "outside"]


# -- the run's record log (io.RecordLog): each record encoded once, unforced writes throttled ------------------
def test_record_log_encodes_each_record_once_and_writes_the_whole_list(tmp_path, monkeypatch):
    import json

    import hf_fedflat.io as io

    encoded = []
    real = io._encode_record
    monkeypatch.setattr(io, "_encode_record", lambda record: encoded.append(record["round"]) or real(record))
    path = tmp_path / "history.json"
    log, history = io.RecordLog(path), []
    for round_index in range(4):
        history.append({"round": round_index, "loss": 1.0 / (round_index + 1), "clients": [1, 2], "path": tmp_path})
        log.write(history)
        assert json.loads(path.read_text()) == json.loads(json.dumps(history, default=str))
    assert encoded == [0, 1, 2, 3]  # each record once, not the whole list every round
    assert path.read_text().count("\n") == 4 + 2  # one record per line between the brackets
    resumed = history[:2]  # a resume replaces the list: it is encoded again from its start
    log.write(resumed)
    assert json.loads(path.read_text()) == json.loads(json.dumps(resumed, default=str)) and encoded[4:] == [0, 1]
    assert not list(tmp_path.glob(".history.json.*"))  # no temporary file left behind


def test_record_log_throttles_unforced_writes_and_flushes_what_is_pending(tmp_path, monkeypatch):
    import json

    import hf_fedflat.io as io

    clock = [100.0]
    monkeypatch.setattr(io.time, "monotonic", lambda: clock[0])
    path = tmp_path / "history.json"
    log, history = io.RecordLog(path, min_interval_seconds=1.0), [{"round": 1}]
    assert log.write(history, force=False)  # the first write is never held back
    history.append({"round": 2})
    clock[0] += 0.5
    assert not log.write(history, force=False) and len(json.loads(path.read_text())) == 1
    log.flush()
    assert len(json.loads(path.read_text())) == 2
    mtime = path.stat().st_mtime_ns
    log.flush()  # nothing pending: no rewrite
    assert path.stat().st_mtime_ns == mtime
    history.append({"round": 3})
    clock[0] += 0.4  # 0.9 s after the first write, but the flush wrote at 0.5: held back
    assert not log.write(history, force=False)
    assert log.write(history, force=True) and len(json.loads(path.read_text())) == 3
    history.append({"round": 4})
    clock[0] += 1.0
    assert log.write(history, force=False) and len(json.loads(path.read_text())) == 4
