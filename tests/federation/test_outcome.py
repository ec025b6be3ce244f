"""Runs that aggregate nothing do not "finish": every round in which no client was aggregated counts toward
``max_consecutive_failed_rounds`` whatever the reason, a non-finite server (or gossip) step is refused, and a
run that did not train raises ``TrainingFailedError`` and says so in its records (``history.json``,
``run_status.json``); the command line's exit status for it is tested in ``tests/cli/test_exit_codes.py``."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from torch import nn

from hf_fedflat import FedTrainingArguments, FederatedTrainer
from hf_fedflat.decentralized import DecentralizedTrainer
from hf_fedflat.federation.outcome import TrainingFailedError

from conftest import TinyClassifier, make_tiny_dataset

TRAIN = make_tiny_dataset(n=96, seed=1)  # 4 iid clients of 24 rows
TEST = make_tiny_dataset(n=30, seed=2)
#: what run_status.json records about the run itself (its outcome fields are compared exactly)
RUN_FIELDS = ("run_id", "pid", "host", "started", "ended")


def outcome(status: dict) -> dict:
    assert all(status.get(key) for key in RUN_FIELDS)
    return {key: value for key, value in status.items() if key not in (*RUN_FIELDS, "learning_check")}  # (below)


class ReluClassifier(TinyClassifier):
    """The tiny MLP with ReLU (unbounded, like real nets: a step of 1e30 overflows the next forward pass) and
    a parameter no loss reaches (an embedding row never looked up): its update is exactly 0."""

    def __init__(self):
        super().__init__()
        self.net[1] = nn.ReLU()
        self.unused = nn.Parameter(torch.zeros(3))


def make(tmp_path, trainer_class=FederatedTrainer, **overrides):
    settings = dict(output_dir=str(tmp_path), use_cpu=True, fed_algorithm="fedavg", num_clients=4,
                    clients_per_round=2, num_rounds=5, local_steps=2, per_device_train_batch_size=4,
                    partition_scheme="iid", learning_rate=0.1, seed=3, max_consecutive_failed_rounds=2,
                    disable_tqdm=True)
    settings.update(overrides)
    torch.manual_seed(0)
    return trainer_class(ReluClassifier(), FedTrainingArguments(**settings), TRAIN, TEST, label_column="labels")


def nan_updates(trainer):  # what --weight_decay nan did (now refused by the config): every update is NaN
    original = trainer.train_client

    def faulty(*args, **kwargs):
        update = original(*args, **kwargs)
        update.delta[0] = float("nan")
        return update

    trainer.train_client = faulty


def zero_steps(trainer):  # a client whose Trainer ran no optimizer step: its "update" is what it received
    original = trainer.train_client

    def faulty(*args, **kwargs):
        update = original(*args, **kwargs)
        update.num_steps = 0
        return update

    trainer.train_client = faulty


def nan_loss(trainer):  # a finite update from a NaN loss (mixed precision skipped every step)
    original = trainer.train_client

    def faulty(*args, **kwargs):
        update = original(*args, **kwargs)
        update.train_loss = float("nan")
        return update

    trainer.train_client = faulty


def raising(trainer):
    def faulty(client_id, *args, **kwargs):
        raise RuntimeError(f"disk on fire at client {client_id}")

    trainer.train_client = faulty


def nan_server_step(trainer):  # an aggregator bug: the new global model has a NaN
    original = trainer.algorithm.server_step

    def faulty(*args, **kwargs):
        params, state = original(*args, **kwargs)
        params = params.clone()
        params[-1] = float("inf")
        return params, state

    trainer.algorithm.server_step = faulty


def nan_gossip(trainer):  # one client's mixed model is NaN: the whole gossip round is refused
    aggregator = trainer.strategy.aggregator
    original = aggregator.mix

    def faulty(matrix, load):
        for client_id, mixed in original(matrix, load):
            if client_id == 2:
                mixed = dict(mixed, params=torch.full_like(mixed["params"], float("nan")))
            yield client_id, mixed

    aggregator.mix = faulty


CASES = {
    # id: (settings, fault, what the reason says)
    "learning_rate 1e30": (dict(learning_rate=1e30), None, "update contains NaN or Inf"),
    "NaN update (weight_decay nan)": ({}, nan_updates, "update contains NaN or Inf"),
    "max_update_norm 1e-12": (dict(max_update_norm=1e-12), None, "exceeds max_update_norm=1e-12"),
    "round_deadline_seconds 1e-9": (dict(round_deadline_seconds=1e-9), None, "straggler: round deadline of 1e-09s"),
    "drop_last, batch > every client": (dict(dataloader_drop_last=True, per_device_train_batch_size=64), None,
                                        "24 rows, fewer than one batch of 64 with dataloader_drop_last"),
    "zero optimizer steps": ({}, zero_steps, "trained 0 optimizer steps"),
    "NaN training loss": ({}, nan_loss, "training loss is nan"),
    "every client raises": ({}, raising, "training raised RuntimeError: disk on fire"),
    "fedadam server_tau 0": (dict(fed_algorithm="fedadam", server_tau=0.0), None,
                             "non-finite server step: params has NaN or Inf"),
    "scaffold, non-finite server step": (dict(fed_algorithm="scaffold"), nan_server_step,
                                         "non-finite server step: params has NaN or Inf"),
    "dfedavg, every update NaN": (dict(fed_algorithm="dfedavg"), nan_updates, "update contains NaN or Inf"),
    "dfedavg, non-finite gossip": (dict(fed_algorithm="dfedavg"), nan_gossip,
                                   "non-finite gossip step: client 2's new model.params has NaN or Inf"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_run_that_aggregates_nothing_stops_after_the_limit_with_the_reason(tmp_path, case, caplog):
    settings, fault, reason = CASES[case]
    decentralized = settings.get("fed_algorithm") == "dfedavg"
    trainer = make(tmp_path, DecentralizedTrainer if decentralized else FederatedTrainer, **settings)
    initial = trainer.space.flatten().clone()
    # FedAdam's m, v and SCAFFOLD's c start at zero (a decentralized run has no server state)
    server_state = {} if decentralized else trainer.algorithm.init_server_state(initial)
    if fault:
        fault(trainer)
    with caplog.at_level(logging.WARNING, logger="hf_fedflat"), pytest.raises(TrainingFailedError) as failed:
        trainer.train()
    error = failed.value
    assert error.reason.startswith("No client was aggregated for 2 consecutive rounds (rounds 1-2); last round: ")
    assert reason in error.reason and reason in caplog.text

    # the records say it: every round failed, with why; the last one and run_status.json say the run failed
    history = json.loads((tmp_path / "history.json").read_text())
    assert [r["round"] for r in history] == [1, 2]  # stopped at the limit, not after 5 rounds
    for record in history:
        assert record["num_clients"] == 0 and record["clients"] == [] and reason in record["round_failed"]
        sampled = trainer.strategy.sample(record["round"] - 1)
        assert [f["client"] for f in record["failed_clients"]] == sorted(sampled)  # each with its reason
    assert history[-1]["run_status"] == "failed" and history[-1]["run_failure"] == error.reason
    status = json.loads((tmp_path / "run_status.json").read_text())
    assert status == error.status and outcome(status) == {
        "status": "failed", "reason": error.reason, "trained": False, "final_model": None, "rounds_run": 2,
        "rounds_aggregated": 0, "rounds_failed": 2, "last_aggregated_round": None,
    }
    # no final model that would look trained; the returned model, the server state and the store are the initial ones
    assert not (tmp_path / "final_model").exists() and error.output.final_model_dir is None
    assert torch.equal(error.output.params, initial)
    state = trainer.strategy.server_state()
    assert state.keys() == server_state.keys()
    assert all(torch.equal(state[piece][name], t) for piece, part in server_state.items() for name, t in part.items())
    if decentralized:  # every local model is still the initial one (a refused gossip writes none)
        assert all(torch.equal(trainer.strategy.local_model(c)["params"], initial) for c in range(4))
    else:
        assert all(trainer.store.get(c) == {} for c in range(4))  # no client state written (SCAFFOLD's c_i)


def test_failed_rounds_fewer_than_the_limit_in_a_row_only_count(tmp_path):
    trainer = make(tmp_path, num_rounds=4, max_consecutive_failed_rounds=2)
    original = trainer.train_client

    def faulty(client_id, round_index, *args, **kwargs):
        update = original(client_id, round_index, *args, **kwargs)
        if round_index in (0, 2):  # rounds 1 and 3 fail, never two in a row
            update.delta[0] = float("nan")
        return update

    trainer.train_client = faulty
    output = trainer.train()
    assert [r["num_clients"] for r in output.history] == [0, 2, 0, 2]
    assert ["round_failed" in r for r in output.history] == [True, False, True, False]
    status = json.loads((tmp_path / "run_status.json").read_text())
    assert outcome(status) == {"status": "completed", "reason": None, "trained": True,
                               "final_model": output.final_model_dir, "rounds_run": 4, "rounds_aggregated": 2,
                               "rounds_failed": 2, "last_aggregated_round": 4}
    assert (tmp_path / "final_model" / "federated_config.json").is_file()


def test_with_no_limit_every_round_runs_and_an_untrained_run_still_fails(tmp_path):
    trainer = make(tmp_path, num_rounds=3, max_consecutive_failed_rounds=0, max_update_norm=1e-12)
    with pytest.raises(TrainingFailedError, match=r"No round aggregated any client \(3 rounds run\)"):
        trainer.train()
    status = json.loads((tmp_path / "run_status.json").read_text())
    assert status["status"] == "failed" and status["rounds_failed"] == 3 and not (tmp_path / "final_model").exists()


def test_a_normal_run_is_unaffected(tmp_path):
    trainer = make(tmp_path, num_rounds=2)
    output = trainer.train()
    assert [r["num_clients"] for r in output.history] == [2, 2]
    assert not any(key in r for r in output.history for key in ("round_failed", "run_status", "failed_clients"))
    status = json.loads((tmp_path / "run_status.json").read_text())
    assert status["status"] == "completed" and status["trained"] and status["rounds_failed"] == 0
    assert output.final_model_dir == str(tmp_path / "final_model")


# --- a run that did not learn says so ------------------------------------------------------------------------
LEARNING = [  # (case, last record, majority class share, initial loss, learned, reason's core)
    ("accuracy at the majority class's share", {"round": 5, "eval_accuracy": 0.105, "eval_loss": 1.0}, 0.1, 2.3,
     False, "round 5's eval_accuracy 0.105 is at the chance level (always predicting the majority class of the "
            "training rows scores 0.1)"),
    ("accuracy just above the margin", {"round": 5, "eval_accuracy": 0.111, "eval_loss": 1.0}, 0.1, 2.3, True, None),
    ("loss stalled at the initial loss", {"round": 3, "eval_accuracy": 0.5, "eval_loss": 2.29}, 0.1, 2.3, False,
     "round 3's eval_loss 2.29 is not below the initial model's loss 2.3"),
    ("loss just below 0.99 x the initial", {"round": 3, "eval_loss": 2.27}, None, 2.3, True, None),
    ("loss above the initial", {"round": 3, "eval_loss": 3.74}, None, 2.3, False,
     "round 3's eval_loss 3.74 is not below the initial model's loss 2.3"),
    ("NaN loss", {"round": 3, "eval_loss": float("nan")}, None, 2.3, False,
     "round 3's eval_loss nan is not below the initial model's loss 2.3"),
]


@pytest.mark.parametrize("case, record, share, initial, learned, core", LEARNING, ids=[c[0] for c in LEARNING])
def test_the_final_metric_is_compared_with_the_chance_level(case, record, share, initial, learned, core):
    from hf_fedflat.federation.outcome import learning_check

    check = learning_check([{"round": 1, "eval_loss": 0.1}, record], majority_share=share, initial_loss=initial)
    assert check["learned"] is learned
    if core is None:
        assert check["reason"] is None
    else:
        assert check["reason"].startswith(f"The model did not learn: {core}. Check learning_rate")


def test_nothing_to_compare_is_no_verdict():
    from hf_fedflat.federation.outcome import learning_check

    assert learning_check([{"round": 1, "train_loss": 2.0}], majority_share=0.5, initial_loss=2.3) is None
    assert learning_check([{"round": 1, "eval_loss": 2.0}], majority_share=None, initial_loss=None) is None


@pytest.mark.parametrize("fail", [False, True])
def test_a_run_at_a_learning_rate_of_1e_12_says_it_did_not_learn(tmp_path, caplog, fail):
    """In the log, run_status.json and the card; with fail_if_not_learned a failure (status failed) that keeps
    final_model/ (nothing trained is lost)."""
    trainer = make(tmp_path, num_rounds=2, learning_rate=1e-12, fail_if_not_learned=fail)
    with caplog.at_level(logging.WARNING, logger="hf_fedflat"):
        if fail:
            with pytest.raises(TrainingFailedError, match=r"^The model did not learn: round 2's eval_"):
                trainer.train()
        else:
            trainer.train()
    status = json.loads((tmp_path / "run_status.json").read_text())
    check = status["learning_check"]
    assert check["learned"] is False and check["reason"] in caplog.text
    assert check["eval_loss"] >= 0.99 * check["initial_loss"]
    assert status["status"] == ("failed" if fail else "completed") and status["final_model"] == str(
        tmp_path / "final_model")
    card = (tmp_path / "final_model" / "README.md").read_text()
    assert "**The model did not learn: round 2's eval_" in card


def test_a_run_that_learned_records_so(tmp_path):
    make(tmp_path, num_rounds=3, learning_rate=0.5).train()
    check = json.loads((tmp_path / "run_status.json").read_text())["learning_check"]
    assert check["learned"] is True and check["eval_loss"] < 0.99 * check["initial_loss"]
    assert "did not learn" not in (tmp_path / "final_model" / "README.md").read_text()
