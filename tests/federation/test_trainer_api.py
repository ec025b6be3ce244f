"""FederatedTrainer looks like transformers.Trainer: train() metrics, evaluate, predict, state, callbacks,
save_model, push_to_hub (offline: HfApi patched), and a push that cannot happen is refused before round 1."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from huggingface_hub import HfApi, RepoUrl
from safetensors.torch import load_file
from transformers import TrainerCallback
from transformers.trainer_callback import TrainerState
from transformers.trainer_utils import PredictionOutput

from hf_fedflat import FedTrainingArguments, FederatedCallback, FederatedTrainer
from hf_fedflat.hub import HubAccessError

from conftest import TinyClassifier, make_tiny_dataset

TRAIN = make_tiny_dataset(n=96, seed=1)
TEST = make_tiny_dataset(n=30, seed=2)
OTHER = make_tiny_dataset(n=21, seed=3)
ROUNDS, CLIENTS_PER_ROUND, LOCAL_STEPS = 3, 3, 2


def make_args(output_dir, **overrides) -> FedTrainingArguments:
    settings = dict(
        output_dir=str(output_dir), use_cpu=True, disable_tqdm=True, fed_algorithm="fedavg", num_clients=6,
        clients_per_round=CLIENTS_PER_ROUND, num_rounds=ROUNDS, local_steps=LOCAL_STEPS, per_device_train_batch_size=4,
        partition_scheme="iid", learning_rate=0.2, seed=7,
    )
    settings.update(overrides)
    return FedTrainingArguments(**settings)


class Recorder(FederatedCallback):
    def __init__(self):
        self.events = []

    def on_train_begin(self, trainer, **kwargs):
        self.events.append(("train_begin",))

    def on_round_end(self, trainer, round_index, record, **kwargs):
        self.events.append(("round_end", record["round"], trainer.state.global_step))

    def on_train_end(self, trainer, history, **kwargs):
        self.events.append(("train_end", len(history)))


class StepCounter(TrainerCallback):
    """A plain transformers callback: a round is a step."""

    def __init__(self):
        self.steps, self.logs, self.evaluations, self.ended = [], [], [], False

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(logs)

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self.evaluations.append(metrics)

    def on_train_end(self, args, state, control, **kwargs):
        self.ended = isinstance(kwargs["model"], TinyClassifier)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("api")
    torch.manual_seed(0)
    recorder, counter = Recorder(), StepCounter()
    trainer = FederatedTrainer(TinyClassifier(), make_args(out), TRAIN, TEST, label_column="labels",
                               callbacks=[recorder])
    trainer.add_callback(counter)
    output = trainer.train()
    return trainer, output, recorder, counter, out


def hand_metrics(model, dataset):
    """Loss and accuracy of ``model`` on ``dataset``, computed directly."""
    x, y = dataset[:]["x"], dataset[:]["labels"]
    with torch.no_grad():
        logits = model(x)["logits"]
    return float(torch.nn.functional.cross_entropy(logits, y)), int((logits.argmax(-1) == y).sum()) / len(y), logits


def test_train_returns_trainer_output_with_the_historys_numbers(trained):
    trainer, output, *_ = trained
    history = output.history
    assert [r["round"] for r in history] == [1, 2, 3]
    # TrainOutput's fields
    assert output.global_step == ROUNDS
    assert output.training_loss == pytest.approx(sum(r["train_loss"] for r in history) / ROUNDS, rel=1e-12)
    metrics = output.metrics
    assert metrics["train_loss"] == output.training_loss
    assert metrics["train_runtime"] == history[-1]["wall_seconds"]
    assert metrics["train_rounds"] == ROUNDS and metrics["train_failed_rounds"] == 0
    assert metrics["train_local_steps"] == ROUNDS * CLIENTS_PER_ROUND * LOCAL_STEPS
    assert metrics["eval_accuracy"] == history[-1]["eval_accuracy"]
    assert metrics["eval_loss"] == history[-1]["eval_loss"]
    # the former fields are still there
    assert output.final_model_dir == str(trained[4] / "final_model")
    torch.testing.assert_close(output.params, trainer.space.flatten(), rtol=0, atol=0)


def test_state_and_log_history(trained, tmp_path):
    trainer, output, *_ = trained
    state = trainer.state
    assert isinstance(state, TrainerState)
    assert state.global_step == ROUNDS and state.max_steps == ROUNDS and state.is_world_process_zero
    rounds = state.log_history[:ROUNDS]
    assert rounds == [{**record, "step": record["round"]} for record in output.history]
    assert state.log_history[ROUNDS] == {**output.metrics, "step": ROUNDS}

    trainer.args.metric_for_best_model = "accuracy"
    try:
        accuracies = [r["eval_accuracy"] for r in output.history]
        best = max(accuracies)
        assert trainer.state.best_metric == best
        assert trainer.state.best_global_step == accuracies.index(best) + 1  # the first round reaching it
    finally:
        trainer.args.metric_for_best_model = None

    # Trainer's helpers: save_state / save_metrics write what the Trainer writes
    trainer.args.output_dir, saved_dir = str(tmp_path), trainer.args.output_dir
    try:
        trainer.save_state()
        trainer.save_metrics("train", output.metrics)
        trainer.log_metrics("train", output.metrics)
    finally:
        trainer.args.output_dir = saved_dir
    loaded = TrainerState.load_from_json(str(tmp_path / "trainer_state.json"))
    assert loaded.global_step == ROUNDS and loaded.log_history[0]["train_loss"] == output.history[0]["train_loss"]
    assert json.loads((tmp_path / "train_results.json").read_text())["train_loss"] == output.training_loss


def test_callbacks_are_called(trained):
    trainer, output, recorder, counter, _ = trained
    assert recorder.events == [("train_begin",), ("round_end", 1, 1), ("round_end", 2, 2), ("round_end", 3, 3),
                               ("train_end", ROUNDS)]
    assert counter.steps == [1, 2, 3]
    assert counter.logs == output.history
    assert counter.evaluations == [{k: v for k, v in r.items() if k.startswith("eval_")} for r in output.history]
    assert counter.ended


def test_add_pop_remove_callback(tmp_path):
    torch.manual_seed(0)
    trainer = FederatedTrainer(TinyClassifier(), make_args(tmp_path), TRAIN, TEST, label_column="labels")
    before = list(trainer.callbacks)
    recorder = Recorder()
    trainer.add_callback(recorder)
    trainer.add_callback(StepCounter)  # a class is instantiated, as in Trainer
    assert trainer.callbacks[: len(before)] == before and len(trainer.callbacks) == len(before) + 2
    popped = trainer.pop_callback(StepCounter)
    assert isinstance(popped, StepCounter) and trainer.pop_callback(StepCounter) is None
    assert trainer.pop_callback(recorder) is recorder and trainer.callbacks == before
    trainer.add_callback(recorder)
    trainer.remove_callback(Recorder)
    assert trainer.callbacks == before
    with pytest.raises(TypeError, match="^add_callback: expected a FederatedCallback or a transformers.TrainerCallback"):
        trainer.add_callback(object())


def test_evaluate_on_a_given_dataset_with_a_prefix(trained):
    trainer, output, *_ = trained
    loss, accuracy, _ = hand_metrics(trainer.model, OTHER)
    metrics = trainer.evaluate(eval_dataset=OTHER, metric_key_prefix="other")
    assert metrics["other_accuracy"] == pytest.approx(accuracy, abs=1e-12)
    assert metrics["other_loss"] == pytest.approx(loss, rel=1e-5)
    assert "other_runtime" in metrics and not any(k.startswith("eval_") for k in metrics)
    assert trainer.state.log_history[-1] == {**metrics, "step": ROUNDS}
    # default: the trainer's eval_dataset, whose metrics the last round recorded (same final model)
    default = trainer.evaluate()
    assert default["eval_accuracy"] == pytest.approx(output.history[-1]["eval_accuracy"], abs=1e-12)
    assert default["eval_loss"] == pytest.approx(output.history[-1]["eval_loss"], rel=1e-6)
    both = trainer.evaluate({"a": OTHER, "b": TEST})
    assert both["eval_a_accuracy"] == metrics["other_accuracy"]
    assert both["eval_b_accuracy"] == default["eval_accuracy"]


def test_predict_returns_prediction_output(trained):
    trainer, *_ = trained
    prediction = trainer.predict(TEST)
    assert isinstance(prediction, PredictionOutput)
    _, _, logits = hand_metrics(trainer.model, TEST)
    np.testing.assert_allclose(prediction.predictions, logits.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(prediction.label_ids, TEST[:]["labels"].numpy())
    by_hand = float((prediction.predictions.argmax(-1) == prediction.label_ids).mean())
    assert prediction.metrics["test_accuracy"] == by_hand
    assert trainer.predict(TEST, metric_key_prefix="final").metrics["final_accuracy"] == by_hand


def test_evaluate_and_predict_report_the_round_not_the_local_trainers_epoch(trained, tmp_path):
    trainer, *_ = trained
    metrics = trainer.evaluate(eval_dataset=OTHER)
    predicted = trainer.predict(TEST).metrics
    for reported in (metrics, predicted):
        assert "epoch" not in reported and reported["round"] == ROUNDS
    assert trainer.evaluate({"a": OTHER, "b": TEST})["round"] == ROUNDS
    # before train(): round 0 (the initial model)
    untrained = FederatedTrainer(TinyClassifier(), make_args(tmp_path), TRAIN, TEST, label_column="labels")
    assert untrained.evaluate()["round"] == 0 and "epoch" not in untrained.evaluate()


def test_evaluate_without_any_dataset_is_refused(tmp_path):
    trainer = FederatedTrainer(TinyClassifier(), make_args(tmp_path), TRAIN, label_column="labels")
    with pytest.raises(ValueError, match="^evaluate: no eval_dataset given and the trainer has none"):
        trainer.evaluate()


def test_save_model_writes_a_loadable_model(trained, tmp_path):
    trainer, output, *_ = trained
    folder = trainer.save_model(str(tmp_path / "copy"))
    weights = load_file(str(Path(folder) / "model.safetensors"))
    fresh = TinyClassifier()
    fresh.load_state_dict(weights)
    x = OTHER[:]["x"]
    with torch.no_grad():
        torch.testing.assert_close(fresh(x)["logits"], trainer.model(x)["logits"], rtol=0, atol=0)
    flat = torch.cat([weights[name].reshape(-1) for name in trainer.space.names])
    torch.testing.assert_close(flat, output.params, rtol=0, atol=0)
    assert json.loads((Path(folder) / "federated_config.json").read_text())["num_rounds"] == ROUNDS


class FakeHub:
    """Patches HfApi at class level: repos created and folders uploaded are recorded."""

    def __init__(self, root: Path, monkeypatch):
        self.root, self.repos, self.uploads = root, [], []
        hub = self

        def create_repo(self, repo_id, *, token=None, private=None, exist_ok=False, **kwargs):
            hub.repos.append({"repo_id": repo_id, "token": token, "private": private})
            return RepoUrl(f"https://huggingface.co/{repo_id}")

        def upload_folder(self, *, repo_id, folder_path, path_in_repo=None, commit_message=None, token=None,
                          revision=None, **kwargs):
            files = sorted(p.relative_to(folder_path).as_posix() for p in Path(folder_path).rglob("*") if p.is_file())
            snapshot = hub.root / str(len(hub.uploads))
            shutil.copytree(folder_path, snapshot)
            hub.uploads.append({"repo_id": repo_id, "message": commit_message, "token": token, "revision": revision,
                                "files": files, "snapshot": snapshot})
            return f"commit-{len(hub.uploads)}"

        monkeypatch.setattr(HfApi, "create_repo", create_repo)
        monkeypatch.setattr(HfApi, "upload_folder", upload_folder)


def test_push_to_hub_refused_when_the_trainer_is_built_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    args = make_args(tmp_path, push_to_hub=True, hub_model_id="org/api-run")
    with pytest.raises(HubAccessError, match=r"^push_to_hub: cannot create or reach the Hub repository 'org/api-run' "
                                             r"\(OfflineModeIsEnabled: .*\)\. HF_HUB_OFFLINE is set\. Check hub_model_id"):
        FederatedTrainer(TinyClassifier(), args, TRAIN, TEST, label_column="labels")
    assert not (tmp_path / "history.json").exists() and not (tmp_path / "final_model").exists()


def test_push_to_hub_args_create_the_repo_before_round_one(tmp_path, monkeypatch):
    hub = FakeHub(tmp_path / "hub", monkeypatch)
    out = tmp_path / "run"
    args = make_args(out, push_to_hub=True, hub_model_id="org/api-run", num_rounds=1)
    trainer = FederatedTrainer(TinyClassifier(), args, TRAIN, TEST, label_column="labels")
    assert [r["repo_id"] for r in hub.repos] == ["org/api-run"] and hub.uploads == []
    assert not (out / "history.json").exists()
    trainer.train()
    assert {r["repo_id"] for r in hub.repos} == {"org/api-run"}
    assert [u["message"] for u in hub.uploads] == ["End of training"]


def test_push_to_hub_method_uploads_the_final_model(trained, tmp_path, monkeypatch):
    trainer, output, *_ = trained
    hub = FakeHub(tmp_path / "hub", monkeypatch)
    saved = trainer.args.hub_model_id
    trainer.args.hub_model_id = "org/api-run"
    try:
        commit = trainer.push_to_hub(commit_message="federated fedavg", token="hf_tok", revision="main", private=True)
    finally:
        trainer.args.hub_model_id = saved
    assert commit == "commit-1" and trainer.hub_push_result.repo_id == "org/api-run"
    assert hub.repos == [{"repo_id": "org/api-run", "token": "hf_tok", "private": True}]
    (upload,) = hub.uploads
    assert (upload["repo_id"], upload["message"], upload["token"], upload["revision"]) == (
        "org/api-run", "federated fedavg", "hf_tok", "main")
    assert {"model.safetensors", "federated_config.json", "README.md"} <= set(upload["files"])
    weights = load_file(str(upload["snapshot"] / "model.safetensors"))
    flat = torch.cat([weights[name].reshape(-1) for name in trainer.space.names])
    torch.testing.assert_close(flat, output.params, rtol=0, atol=0)
    assert not math.isnan(output.training_loss)


def test_cli_push_to_hub_offline_fails_before_round_one(tmp_path, monkeypatch, capsys):
    from hf_fedflat.cli import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "out"
    assert 2 == main(["train", "--dataset_name", "digits", "--model_name", "small_cnn", "--image_size", "8",
              "--output_dir", str(out), "--fed_algorithm", "fedavg", "--num_clients", "4", "--clients_per_round", "2",
              "--num_rounds", "1", "--local_steps", "1", "--per_device_train_batch_size", "8", "--use_cpu",
              "--disable_tqdm", "true", "--push_to_hub", "--hub_model_id", "org/cli-run"])
    err = capsys.readouterr().err  # one line, exit status 2
    assert "hf-fedflat train: error: push_to_hub: cannot create or reach the Hub repository 'org/cli-run'" in err
    assert not (out / "history.json").exists() and not (out / "final_model").exists()
