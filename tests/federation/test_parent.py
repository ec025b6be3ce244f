"""Exit when the launcher dies: when the watch is on, and a training process whose launcher is SIGKILLed stops
at its next check instead of running on alone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hf_fedflat.federation.parent import ParentWatch, watch_requested

from helpers import TEST_SCRIPTS


def test_parent_watch_settings(monkeypatch):
    assert watch_requested({}) is False  # a plain process (nohup ... &) outlives its shell
    assert watch_requested({"TORCHELASTIC_RUN_ID": "x"}) and watch_requested({"ACCELERATE_DYNAMO_BACKEND": "NO"})
    assert watch_requested({"HF_FEDFLAT_EXIT_WITH_PARENT": "1"})
    assert not watch_requested({"HF_FEDFLAT_EXIT_WITH_PARENT": "0", "TORCHELASTIC_RUN_ID": "x"})
    with pytest.raises(ValueError, match=r"HF_FEDFLAT_EXIT_WITH_PARENT: expected auto, 1 or 0 \(or true/false, "
                                         r"yes/no, on/off\), got 'maybe'; set one"):
        watch_requested({"HF_FEDFLAT_EXIT_WITH_PARENT": "maybe"})
    watch = ParentWatch(enabled=True)
    watch.check()  # same parent: nothing happens
    monkeypatch.setattr(os, "getppid", lambda: watch.parent + 1)
    with pytest.raises(SystemExit, match="the launcher .* exited before round 7"):
        watch.check(" before round 7")
    assert not ParentWatch(enabled=False).parent_died()


LAUNCHER = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, *sys.argv[1:]], stdout=sys.stderr)
print(child.pid, flush=True)
time.sleep(600)
"""


def test_the_training_process_exits_when_its_launcher_is_killed(tmp_path):
    """A launcher starts a run of 100000 rounds; once it has trained a round, the launcher is SIGKILLed: the
    run stops at its next check (between rounds/clients) instead of running on alone."""
    out = tmp_path / "run"
    script = TEST_SCRIPTS / "tiny_federated_run.py"
    run_args = [str(script), "--output_dir", str(out), "--use_cpu", "true", "--num_clients", "4",
                "--clients_per_round", "2", "--num_rounds", "100000", "--local_steps", "1",
                "--per_device_train_batch_size", "4", "--partition_scheme", "iid", "--eval_every_n_rounds", "1000",
                "--disable_tqdm", "true"]
    env = dict(os.environ, HF_FEDFLAT_EXIT_WITH_PARENT="1", PYTHONUNBUFFERED="1")
    log = open(tmp_path / "run.log", "w")
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, *run_args], env=env, stdout=subprocess.PIPE,
                                stderr=log, text=True)
    child = int(launcher.stdout.readline())
    try:
        deadline = time.monotonic() + 120
        while not (out / "history.json").is_file():  # the run is training
            assert time.monotonic() < deadline and launcher.poll() is None, (tmp_path / "run.log").read_text()
            time.sleep(0.2)
        launcher.kill()
        launcher.wait()
        deadline = time.monotonic() + 60
        while _alive(child):
            assert time.monotonic() < deadline, "the training process outlived its launcher by 60 s"
            time.sleep(0.2)
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)
        log.close()
    assert "the launcher (parent process" in (tmp_path / "run.log").read_text()
    rounds = len(json.loads((out / "history.json").read_text()))
    assert 1 <= rounds < 100000 and not (out / "final_model").exists()


def _alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting for a reaper that never comes)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")
