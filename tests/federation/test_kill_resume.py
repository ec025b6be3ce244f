"""SIGKILL a run mid-round and mid-checkpoint; resuming from the latest checkpoint gives the bit-identical
final model of an uninterrupted run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from hf_fedflat.federation import list_checkpoints

from helpers import REPO_ROOT, TEST_SCRIPTS

SCRIPT = TEST_SCRIPTS / "tiny_federated_run.py"
# LESAM's old models, FedDyn's h_i (client) and sum of h_i (server), SCAFFOLD-free but stateful everywhere
FLAGS = ["--use_cpu", "true", "--fed_algorithm", "fedlesam_d", "--num_clients", "6", "--clients_per_round", "3",
         "--num_rounds", "5", "--local_steps", "2", "--per_device_train_batch_size", "4", "--partition_scheme", "iid",
         "--learning_rate", "0.1", "--lr_decay_per_round", "0.9", "--save_every_n_rounds", "1", "--disable_tqdm", "true",
         "--seed", "11"]


def launch(output_dir: Path, kill: str = "", resume: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "FEDFLAT_TEST_KILL": kill}
    command = [sys.executable, str(SCRIPT), "--output_dir", str(output_dir), *FLAGS]
    if resume:
        command += ["--resume_from_checkpoint", "latest"]
    return subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)


def final(output_dir: Path):
    return load_file(str(output_dir / "final_params.safetensors"))["params"]


@pytest.mark.slow  # (about 40 s: resume against the uninterrupted run is also checked in test_loop.py)
@pytest.mark.timeout(600)
def test_sigkill_mid_round_and_mid_checkpoint_then_resume_is_bit_identical(tmp_path):
    full = launch(tmp_path / "full")
    assert full.returncode == 0, full.stderr[-3000:]

    killed = launch(tmp_path / "round", kill="client:3")
    assert killed.returncode == -signal.SIGKILL
    assert [p.name for p in list_checkpoints(tmp_path / "round" / "checkpoints")] == ["round-1", "round-2"]
    resumed = launch(tmp_path / "round", resume=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (final(tmp_path / "round") == final(tmp_path / "full")).all()

    killed = launch(tmp_path / "save", kill="checkpoint:4")
    assert killed.returncode == -signal.SIGKILL
    leftovers = [p.name for p in (tmp_path / "save" / "checkpoints").iterdir() if p.name.startswith(".tmp")]
    assert leftovers  # the kill really landed inside the save
    assert list_checkpoints(tmp_path / "save" / "checkpoints")[-1].name == "round-3"  # previous one intact
    resumed = launch(tmp_path / "save", resume=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (final(tmp_path / "save") == final(tmp_path / "full")).all()
    assert not [p for p in (tmp_path / "save" / "checkpoints").iterdir() if p.name.startswith(".")]
