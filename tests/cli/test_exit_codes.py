"""Command-line runs end with one line and a status for bad input (2) and for a run that trained nothing (3);
a bug keeps its traceback; a token given as a flag is warned about and never logged."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys

import pytest

from hf_fedflat import cli
from hf_fedflat.cli.exit_codes import EXIT_BAD_INPUT, run_command_line
from hf_fedflat.federation.checkpoint import CheckpointError
from hf_fedflat.federation.outcome import EXIT_TRAINING_FAILED, TrainingFailedError
from hf_fedflat.cli.parsing import ConfigError

from helpers import REPO_ROOT


def test_cli_bad_field_is_one_line_and_status_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("hf_fedflat.cli.experiment.run_experiment",
                        lambda *a, **k: pytest.fail("no experiment may start on a refused field"))
    status = cli.main(["train", "--dataset_name", "digits", "--output_dir", str(tmp_path / "run"),
                       "--per_device_train_batch_size", "0"])
    err = capsys.readouterr().err
    assert status == EXIT_BAD_INPUT
    assert "hf-fedflat train: error: per_device_train_batch_size: must be an integer >= 1, got 0." in err
    assert "Traceback" not in err and not (tmp_path / "run").exists()


@pytest.mark.parametrize("error, status, text", [
    (CheckpointError("Checkpoint out/checkpoints/round-3 is incomplete or corrupt: manifest.json is missing"),
     EXIT_BAD_INPUT, "hf-fedflat train: error: Checkpoint out/checkpoints/round-3 is incomplete or corrupt"),
    (TrainingFailedError("No round aggregated any client (2 rounds run)", output=None),
     EXIT_TRAINING_FAILED, "Training failed: No round aggregated any client (2 rounds run)"),
])
def test_cli_run_errors_map_to_their_status(tmp_path, capsys, monkeypatch, error, status, text):
    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr("hf_fedflat.cli.experiment.run_experiment", fail)
    assert cli.main(["train", "--dataset_name", "digits", "--output_dir", str(tmp_path)]) == status
    assert text in capsys.readouterr().err


def test_run_command_line_statuses(capsys):
    def raising(error):
        def main():
            raise error
        return main

    with pytest.raises(SystemExit) as ok:
        run_command_line(lambda: None, prog="r.py")
    assert ok.value.code == 0
    with pytest.raises(SystemExit) as bad:
        run_command_line(raising(ConfigError("seed: must be an integer in 0..4294967295, got -1.")), prog="r.py")
    assert bad.value.code == EXIT_BAD_INPUT
    assert capsys.readouterr().err == "r.py: error: seed: must be an integer in 0..4294967295, got -1.\n"
    with pytest.raises(SystemExit) as failed:
        run_command_line(raising(TrainingFailedError("nothing aggregated", output=None)), prog="r.py")
    assert failed.value.code == EXIT_TRAINING_FAILED
    with pytest.raises(ZeroDivisionError):  # a bug is not turned into a one-line message
        run_command_line(raising(ZeroDivisionError("bug")), prog="r.py")


def test_parse_errors_are_config_errors_and_still_value_errors():
    with pytest.raises(ConfigError, match="^seed: ") as caught:
        cli.parse_train_args(["--dataset_name", "digits", "--seed", "-1"])
    assert isinstance(caught.value, ValueError)


def test_recipe_bad_flag_exits_2_with_one_line(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(REPO_ROOT / "recipes" / "quickstart.py"), "--smoke", "--output_dir",
                           str(tmp_path / "run"), "--seed", "-1"], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == EXIT_BAD_INPUT, done.stderr
    last_line = done.stderr.strip().splitlines()[-1]
    assert last_line == "quickstart.py: error: seed: must be an integer in 0..4294967295, got -1."
    assert "Traceback" not in done.stderr and not (tmp_path / "run").exists()


def test_the_cli_exits_non_zero_and_warns_about_a_token_flag(tmp_path, caplog):
    out = tmp_path / "out"
    argv = ["train", "--dataset_name", "digits", "--test_fraction", "0.05", "--model_name", "small_cnn",
            "--image_size", "8", "--output_dir", str(out), "--num_clients", "4", "--clients_per_round", "2",
            "--num_rounds", "4", "--local_steps", "1", "--per_device_train_batch_size", "8", "--use_cpu", "true",
            "--disable_tqdm", "true", "--max_update_norm", "1e-12", "--max_consecutive_failed_rounds", "2",
            "--hub_token", "hf_not_a_real_token"]
    with caplog.at_level(logging.WARNING, logger="hf_fedflat"):
        assert cli.main(argv) == EXIT_TRAINING_FAILED == 3
    assert "hub_token is given as a command-line flag" in caplog.text and "HF_TOKEN" in caplog.text
    assert "hf_not_a_real_token" not in caplog.text
    status = json.loads((out / "run_status.json").read_text())
    assert status["status"] == "failed" and "exceeds max_update_norm=1e-12" in status["reason"]
    assert not (out / "final_model").exists()


# --- a full disk: one line naming the file, the last complete checkpoint and how to resume; status 4 -------------
#: a digits run whose checkpoints hold global_params.safetensors (755,912 bytes) and whose final model holds
#: model.safetensors (32 bytes of metadata more)
DIGITS_RUN = ["--dataset_name", "digits", "--image_size", "8", "--num_clients", "4", "--clients_per_round", "2",
              "--local_steps", "1", "--save_every_n_rounds", "1", "--disable_tqdm", "true", "--report_to", "none",
              "--use_cpu", "true"]


@contextlib.contextmanager
def file_size_limit(limit: int):
    """Files this process writes cannot grow past ``limit`` bytes (RLIMIT_FSIZE's soft limit: the kernel fails the
    write with EFBIG, a real limit on what reaches the disk; SIGXFSZ ignored, as a full disk sends none)."""
    import resource
    import signal

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


def train(out, *flags, limit: int | None = None) -> int:
    with file_size_limit(limit) if limit else contextlib.nullcontext():
        return cli.main(["train", *DIGITS_RUN, "--output_dir", str(out), *flags])


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    errors = [line for line in err.replace("\r", "\n").splitlines() if line.strip() and "%|" not in line]  # (bars)
    assert "Traceback" not in err and len(errors) == 1, err[-3000:]
    return errors[0]


def test_a_full_disk_at_the_final_save_names_the_file_and_the_checkpoint_to_resume(tmp_path, capsys):
    from hf_fedflat.cli.exit_codes import EXIT_DISK_FULL
    from hf_fedflat.io import verify_complete_dir

    out = tmp_path / "run"
    capsys.readouterr()
    assert train(out, "--num_rounds", "2", limit=755_920) == EXIT_DISK_FULL
    assert one_error_line(capsys) == (
        f"hf-fedflat train: error: {out}/final_model/model.safetensors: no room left to write it (File too large); "
        f"the last complete checkpoint is {out}/checkpoints/round-2 (round 2): free space, then resume with "
        "--resume_from_checkpoint latest.")
    assert sorted(p.name for p in out.iterdir() if p.name.startswith((".final", "final"))) == []
    assert json.loads((out / "run_status.json").read_text())["status"] == "interrupted"
    # nothing trained is lost: the resume saves round 2's model as the final one, training nothing again
    assert train(out, "--num_rounds", "2", "--resume_from_checkpoint", "latest") == 0
    assert len(json.loads((out / "history.json").read_text())) == 2
    verify_complete_dir(out / "final_model")


def test_a_full_disk_at_a_checkpoint_keeps_the_earlier_ones(tmp_path, capsys):
    from hf_fedflat.cli.exit_codes import EXIT_DISK_FULL
    from hf_fedflat.federation.checkpoint import verify_files

    out = tmp_path / "run"
    assert train(out, "--num_rounds", "1") == 0
    capsys.readouterr()
    assert train(out, "--num_rounds", "3", "--resume_from_checkpoint", "latest", limit=700_000) == EXIT_DISK_FULL
    assert one_error_line(capsys) == (
        f"hf-fedflat train: error: {out}/checkpoints/round-2/global_params.safetensors: no room left to write it "
        f"(File too large); the last complete checkpoint is {out}/checkpoints/round-1 (round 1): free space, then "
        "resume with --resume_from_checkpoint latest.")
    assert sorted(os.listdir(out / "checkpoints")) == ["round-1"]  # no partial round-2 left taking room
    verify_files(out / "checkpoints" / "round-1")
