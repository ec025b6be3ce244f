"""``--report_to trackio`` (Hugging Face's tracker, the ``trackio`` extra, which the ``test`` extra installs): one record per round, logged locally and
offline (``TRACKIO_DIR`` in the test's folder, ``HF_HUB_OFFLINE=1``), read back with trackio's own storage."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import trackio  # noqa: F401  (installed by the test extra: the test runs, it is never skipped)

ROUNDS = 3


def test_trackio_receives_every_round_offline(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRACKIO_DIR": str(tmp_path / "trackio"), "OMP_NUM_THREADS": "1"}
    train = [sys.executable, "-m", "hf_fedflat.cli", "train", "--dataset_name", "digits", "--model_name", "small_cnn",
             "--image_size", "8", "--num_clients", "4", "--clients_per_round", "2", "--num_rounds", str(ROUNDS),
             "--local_steps", "2", "--per_device_train_batch_size", "8", "--use_cpu", "true", "--seed", "1",
             "--report_to", "trackio", "--project", "fedflat_test", "--output_dir", str(tmp_path / "run")]
    result = subprocess.run(train, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    read = ("import json\nfrom trackio.sqlite_storage import SQLiteStorage as S\n"
            "runs = S.get_runs('fedflat_test')\nprint('LOGS', json.dumps([S.get_logs('fedflat_test', r) for r in runs], "
            "default=str))")
    out = subprocess.run([sys.executable, "-c", read], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    (logs,) = json.loads(out.stdout.split("LOGS", 1)[1])
    history = json.loads((tmp_path / "run" / "history.json").read_text())
    assert len(logs) == ROUNDS == len(history)
    for logged, record in zip(logs, history):  # each round's numbers, as history.json has them
        assert logged["train/global_step"] == record["round"]
        assert logged["eval/accuracy"] == pytest.approx(record["eval_accuracy"], abs=0)
        assert logged["eval/loss"] == pytest.approx(record["eval_loss"], abs=0)
