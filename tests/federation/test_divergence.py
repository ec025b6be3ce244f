"""A diverged run fails: a round whose train loss is NaN/Inf or above divergence_factor x max(1, the initial loss)
stops the run (TrainingFailedError, exit status 3) with the reason in run_status.json, history.json and the log;
no final_model/ is written and the diverged round is not checkpointed. The check changes no number of a run."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from hf_fedflat import FedTrainingArguments, cli
from hf_fedflat.federation import TrainingFailedError
from hf_fedflat.federation.divergence import DivergenceGuard
from hf_fedflat.federation.outcome import EXIT_TRAINING_FAILED

from helpers.runs import run

TINY = dict(fed_algorithm="fedavg", num_rounds=3, save_every_n_rounds=1, disable_tqdm=True)


def blow_up(trainer, at_round: int, loss) -> None:
    """From round ``at_round`` (1-based) on, every client reports ``loss`` (a number, or a multiple of the run's
    bound: ``("bound", 1.01)``); its update stays finite."""
    original = trainer.train_client

    def train_client(client_id, round_index, *args, **kwargs):
        update = original(client_id, round_index, *args, **kwargs)
        if round_index + 1 >= at_round:
            update.train_loss = trainer.divergence.bound * loss[1] if isinstance(loss, tuple) else loss
        return update

    trainer.train_client = train_client


class BlowUp:
    """A callback-free way to inject the loss: patch the trainer as it is built (helpers.runs.run builds it)."""

    def __init__(self, monkeypatch, at_round, loss):
        from hf_fedflat.federation import trainer as trainer_module

        original = trainer_module.FederatedTrainer.__init__

        def init(self, *args, **kwargs):
            original(self, *args, **kwargs)
            blow_up(self, at_round, loss)

        monkeypatch.setattr(trainer_module.FederatedTrainer, "__init__", init)


# (case, round the loss blows up at, the loss reported, divergence_factor, fails)
CASES = [
    ("1e6 at round 2", 2, 1e6, 1000.0, True),
    ("just above the bound", 1, ("bound", 1.001), 1000.0, True),
    ("just below the bound", 1, ("bound", 0.999), 1000.0, False),
    ("1e6 with the check off (0)", 2, 1e6, 0, False),
    ("1e6 with the check off (None)", 2, 1e6, None, False),
    ("1e6 under a raised factor", 2, 1e6, 1e7, False),
]


@pytest.mark.parametrize("case, at_round, loss, factor, fails", CASES, ids=[c[0] for c in CASES])
def test_a_round_above_the_bound_fails_the_run(tmp_path, monkeypatch, caplog, case, at_round, loss, factor, fails):
    BlowUp(monkeypatch, at_round, loss)
    if not fails:
        _, output = run(tmp_path, divergence_factor=factor, **TINY)
        assert output.final_model_dir and json.loads((tmp_path / "run_status.json").read_text())["status"] == \
            "completed"
        return
    with caplog.at_level(logging.ERROR, logger="hf_fedflat"), pytest.raises(TrainingFailedError) as failed:
        run(tmp_path, divergence_factor=factor, **TINY)
    reason = failed.value.reason
    assert reason.startswith(f"Diverged: round {at_round}'s train loss ") and " exceeds " in reason
    assert "divergence_factor" in reason and reason in caplog.text
    status = json.loads((tmp_path / "run_status.json").read_text())
    assert status["status"] == "failed" and status["reason"] == reason and status["final_model"] is None
    history = json.loads((tmp_path / "history.json").read_text())
    assert len(history) == at_round and history[-1]["run_failure"] == reason
    # no final model, and the diverged round is not checkpointed: the last checkpoint is the last good round
    assert not (tmp_path / "final_model").exists()
    saved = sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) if at_round > 1 else []
    assert saved == [f"round-{r}" for r in range(1, at_round)]


def test_the_check_changes_no_number_and_the_reference_survives_a_resume(tmp_path, monkeypatch):
    _, checked = run(tmp_path / "checked", **TINY)
    _, unchecked = run(tmp_path / "unchecked", divergence_factor=0, **TINY)
    assert torch.equal(checked.params, unchecked.params)  # measuring the initial loss consumed no random number
    meta = json.loads((tmp_path / "checked" / "checkpoints" / "round-3" / "federated_state.json").read_text())
    reference = meta["divergence_reference"]
    assert reference["rows"] == 96 and 0.5 < reference["initial_loss"] < 2.0
    BlowUp(monkeypatch, 4, 1e6)
    with pytest.raises(TrainingFailedError, match=rf"exceeds {1000 * max(1.0, reference['initial_loss']):.4g} "):
        run(tmp_path / "checked", resume="latest", **{**TINY, "num_rounds": 4})


@pytest.mark.parametrize("loss", [float("nan"), float("inf")])
def test_a_non_finite_round_loss_has_diverged(loss):
    guard = DivergenceGuard(1000.0, {"initial_loss": 2.3, "rows": 256})
    assert guard.check({"round": 4, "train_loss": loss}).startswith(f"Diverged: round 4's train loss is {loss}")
    assert guard.check({"round": 4, "train_loss": 2300.0}) is None and guard.check({"round": 4}) is None


@pytest.mark.parametrize("value", [-1.0, 0.5, float("inf"), "x"])
def test_divergence_factor_is_validated(tmp_path, value):
    with pytest.raises(ValueError, match=r"^divergence_factor: "):
        FedTrainingArguments(output_dir=str(tmp_path), divergence_factor=value)


def test_the_command_line_exits_3_without_a_final_model(tmp_path, capsys):
    folder = tmp_path / "run"
    code = cli.main(["train", "--dataset_name", "digits", "--image_size", "8", "--num_clients", "4",
                     "--clients_per_round", "2", "--num_rounds", "2", "--local_steps", "4", "--learning_rate", "1e4",
                     "--output_dir", str(folder), "--disable_tqdm", "true", "--use_cpu", "true"])
    assert code == EXIT_TRAINING_FAILED
    assert "Training failed: Diverged: round 1's train loss" in capsys.readouterr().err
    assert not (folder / "final_model").exists()
    assert json.loads((folder / "run_status.json").read_text())["status"] == "failed"


def test_a_round_whose_new_global_model_diverged_is_not_checkpointed(tmp_path):
    """FedAdam with server_learning_rate 1e4: the clients' train loss is fine, the aggregated model's eval loss is
    not; the run fails at that round and keeps no checkpoint of it (a resume would start from a blown-up model)."""
    with pytest.raises(TrainingFailedError) as failed:
        run(tmp_path, fed_algorithm="fedadam", server_learning_rate=1e4, num_rounds=3, save_every_n_rounds=1,
            disable_tqdm=True)
    history = json.loads((tmp_path / "history.json").read_text())
    assert json.loads((tmp_path / "run_status.json").read_text())["status"] == "failed"
    # the initial loss of 3 classes is near ln 3: the bound is 1000 x max(1, it), the clients stay far below it
    assert len(history) == 1 and history[0]["train_loss"] < 10 and history[0]["eval_loss"] > 1000 * 1.5
    assert failed.value.reason.startswith(f"Diverged: round 1's eval loss {history[0]['eval_loss']:.4g} exceeds ")
    assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "final_model").exists()


def test_a_resume_from_a_checkpoint_without_a_reference_measures_one(tmp_path, monkeypatch):
    """A run started with the check off, resumed with it on: the resumed run measures the initial loss as a fresh
    run does, so a loss of 1e6 fails it (it ran to the end before)."""
    run(tmp_path, divergence_factor=0, **{**TINY, "num_rounds": 2})
    meta = json.loads((tmp_path / "checkpoints" / "round-2" / "federated_state.json").read_text())
    assert meta["divergence_reference"] is None
    run(tmp_path / "fresh", **{**TINY, "num_rounds": 1})
    reference = json.loads((tmp_path / "fresh" / "checkpoints" / "round-1" / "federated_state.json").read_text())[
        "divergence_reference"]
    BlowUp(monkeypatch, 3, 1e6)
    with pytest.raises(TrainingFailedError) as failed:
        run(tmp_path, resume="latest", **{**TINY, "num_rounds": 3})
    assert failed.value.reason.startswith(
        f"Diverged: round 3's train loss 1e+06 exceeds {1000 * max(1.0, reference['initial_loss']):.4g} ")
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["round-1", "round-2"]
    assert json.loads((tmp_path / "run_status.json").read_text())["status"] == "failed"
