"""Hub pushes (``hf_fedflat.hub.push``), offline: ``HfApi`` is patched at class level and uploads land in a folder.
The final model in the hf_fedflat or timm layout, the pushes a run plans from its hub_strategy, a push callback
during a run whose token is never written, and a truncated final model refused before anything is uploaded."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from huggingface_hub import HfApi, ModelCard, RepoUrl
from safetensors.torch import load_file

from hf_fedflat import FedTrainingArguments, FederatedTrainer
from hf_fedflat.data import load_digits_dataset
from hf_fedflat.hub import HubPushCallback, planned_pushes, push_final_model
from hf_fedflat.io import IncompleteSaveError
from hf_fedflat.models import create_model, load_model

from helpers.hub import SENTINEL, write_run
from helpers.runs import run

TINY_VIT = dict(patch_size=8, depth=1, embed_dim=32, num_heads=2)


class FakeHub:
    """Records ``create_repo``/``upload_folder`` calls and keeps a copy of every uploaded folder."""

    def __init__(self, root: Path):
        self.root = root
        self.repos: list[dict] = []
        self.uploads: list[dict] = []

    def repo(self, repo_id: str) -> Path:
        return self.root / "repos" / repo_id

    def install(self, monkeypatch):
        hub = self

        def create_repo(self, repo_id, *, token=None, private=None, exist_ok=False, **kwargs):
            hub.repos.append({"repo_id": repo_id, "token": token, "private": private, "exist_ok": exist_ok})
            return RepoUrl(f"https://huggingface.co/{repo_id if '/' in repo_id else 'tester/' + repo_id}")

        def upload_folder(self, *, repo_id, folder_path, path_in_repo=None, commit_message=None, token=None, **kwargs):
            snapshot = hub.root / "uploads" / str(len(hub.uploads))
            shutil.copytree(folder_path, snapshot)
            target = hub.repo(repo_id) / (path_in_repo or "")
            shutil.copytree(folder_path, target, dirs_exist_ok=True)
            hub.uploads.append({"repo_id": repo_id, "path_in_repo": path_in_repo, "message": commit_message,
                                "token": token, "snapshot": snapshot, "files": sorted(
                                    p.relative_to(folder_path).as_posix() for p in Path(folder_path).rglob("*") if p.is_file())})
            return f"https://huggingface.co/{repo_id}/commit/{len(hub.uploads)}"

        def create_commit(self, *args, **kwargs):
            raise AssertionError("create_commit must not be reached: every upload goes through upload_folder")

        monkeypatch.setattr(HfApi, "create_repo", create_repo)
        monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
        monkeypatch.setattr(HfApi, "create_commit", create_commit)


@pytest.fixture
def fake_hub(tmp_path, monkeypatch):
    hub = FakeHub(tmp_path / "hub")
    hub.install(monkeypatch)
    return hub


def test_push_hf_fedflat_layout(tmp_path, fake_hub):
    torch.manual_seed(0)
    model = create_model("small_cnn", 3, in_chans=1, image_size=8)
    final = write_run(tmp_path / "run", model)
    args = FedTrainingArguments(output_dir=str(tmp_path / "run"), use_cpu=True, hub_model_id="my-run", hub_private_repo=True,
                                hub_token=SENTINEL, num_clients=20, clients_per_round=5, fed_algorithm="fedsam")
    result = push_final_model(final, args, card_inputs={"dataset_name": "digits"})

    assert fake_hub.repos == [{"repo_id": "my-run", "token": SENTINEL, "private": True, "exist_ok": True}]
    (upload,) = fake_hub.uploads
    assert (upload["repo_id"], upload["token"], upload["path_in_repo"]) == ("tester/my-run", SENTINEL, None)
    assert upload["files"] == ["README.md", "config.json", "federated_config.json", "model.safetensors",
                               "partition_heatmap.png", "training_curves.png"]
    assert (result.repo_id, result.layout) == ("tester/my-run", "hf_fedflat")
    repo = fake_hub.repo("tester/my-run")
    card = ModelCard.load(repo / "README.md")
    assert 'from_pretrained("tester/my-run")' in card.text and card.data.model_name == "my-run"
    reloaded = load_model(repo)
    for (name, a), b in zip(model.state_dict().items(), reloaded.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    assert not [p for p in (tmp_path / "run").iterdir() if p.name.startswith(".hub-staging-")]
    assert not (final / "README.md").exists()  # the run's own folder is left as it was


def test_push_timm_model_in_timm_format(tmp_path, fake_hub):
    import timm
    from transformers import AutoModelForImageClassification

    torch.manual_seed(0)
    model = create_model("vit_tiny_patch16_224", 3, in_chans=1, image_size=16, **TINY_VIT).eval()
    final = write_run(tmp_path / "vit-run", model)
    args = FedTrainingArguments(output_dir=str(tmp_path / "vit-run"), use_cpu=True, hub_token=SENTINEL)
    result = push_final_model(final, args, data_config={"mean": (0.3,), "std": (0.4,)})

    assert result.layout == "timm" and result.repo_id == "tester/vit-run"  # repo named after output_dir
    repo = fake_hub.repo("tester/vit-run")
    assert fake_hub.uploads[0]["files"] == [
        "README.md", "config.json", "hf_fedflat/config.json", "hf_fedflat/federated_config.json",
        "hf_fedflat/model.safetensors", "model.safetensors", "partition_heatmap.png", "training_curves.png"]
    config = json.loads((repo / "config.json").read_text())
    assert config["architecture"] == "vit_tiny_patch16_224" and config["num_classes"] == 3
    assert "num_classes" not in config["model_args"] and config["pretrained_cfg"]["mean"] == [0.3]

    x = torch.randn(2, 1, 16, 16)
    with torch.no_grad():
        expected = model(pixel_values=x).logits
        by_timm = timm.create_model(f"local-dir:{repo}", pretrained=True).eval()(x)
        by_fedflat = load_model(repo / "hf_fedflat")(pixel_values=x).logits
        by_transformers = AutoModelForImageClassification.from_pretrained(repo).eval()(pixel_values=x).logits
    for logits in (by_timm, by_fedflat, by_transformers):
        torch.testing.assert_close(logits, expected, rtol=0, atol=0)
    card = ModelCard.load(repo / "README.md")
    assert card.data.library_name == "timm" and "timm" in card.data.tags
    assert 'timm.create_model("hf-hub:tester/vit-run", pretrained=True)' in card.text
    assert 'subfolder="hf_fedflat"' in card.text


def test_planned_pushes_follow_hub_strategy():
    assert planned_pushes("end", 4, 2) == []
    assert planned_pushes("every_save", 4, 2) == ["model"]
    assert planned_pushes("every_save", 3, 2) == []
    assert planned_pushes("every_save", 4, 0) == []  # no checkpoints, no intermediate pushes
    assert planned_pushes("checkpoint", 4, 2) == ["model", "last-checkpoint"]
    assert planned_pushes("all_checkpoints", 6, 3) == ["model", "checkpoints/round-6"]
    with pytest.raises(ValueError, match="^hub_strategy: "):
        planned_pushes("sometimes", 1, 1)


def test_push_callback_during_a_run_and_the_token_is_never_written(tmp_path, fake_hub, caplog, capsys):
    caplog.set_level(logging.DEBUG)
    out = tmp_path / "run"
    args = FedTrainingArguments(
        output_dir=str(out), use_cpu=True, disable_tqdm=True, fed_algorithm="fedavg", num_clients=4, clients_per_round=2,
        num_rounds=2, local_steps=2, per_device_train_batch_size=8, learning_rate=0.05, partition_scheme="iid",
        save_every_n_rounds=1, hub_strategy="checkpoint", hub_always_push=True, hub_model_id="org/digits-run",
        hub_token=SENTINEL, report_to="tensorboard", seed=3,
    )
    data = load_digits_dataset(image_size=8)
    torch.manual_seed(0)
    model = create_model("small_cnn", 10, in_chans=1, image_size=8)
    callback = HubPushCallback(card_kwargs={"dataset_name": "digits"})
    trainer = FederatedTrainer(model, args, data["train"], data["test"].select(range(60)), callbacks=[callback])
    output = trainer.train()

    assert [(u["path_in_repo"], u["message"]) for u in fake_hub.uploads] == [
        (None, "Training in progress, round 1"), ("last-checkpoint", "Training in progress, round 1, checkpoint"),
        (None, "Training in progress, round 2"), ("last-checkpoint", "Training in progress, round 2, checkpoint"),
        (None, "End of training"),
    ]
    assert {u["repo_id"] for u in fake_hub.uploads} == {"org/digits-run"}
    assert {u["token"] for u in fake_hub.uploads} == {SENTINEL}
    # the round-1 push holds the round-1 global model (from its checkpoint), not the live weights
    round1 = load_file(str(fake_hub.uploads[0]["snapshot"] / "model.safetensors"))
    checkpoint1 = load_file(str(out / "checkpoints" / "round-1" / "global_params.safetensors"))
    assert set(checkpoint1) <= set(round1)
    for name, tensor in checkpoint1.items():
        torch.testing.assert_close(round1[name], tensor, rtol=0, atol=0)
    assert "Training in progress: 1 of 2 rounds done" in (fake_hub.uploads[0]["snapshot"] / "README.md").read_text()
    assert not torch.equal(load_file(str(fake_hub.uploads[2]["snapshot"] / "model.safetensors"))["backbone.fc2.weight"],
                           round1["backbone.fc2.weight"])
    # the swap to the checkpoint's weights was undone: the live model is the final global model
    torch.testing.assert_close(trainer.space.flatten(), output.params, rtol=0, atol=0)

    repo = fake_hub.repo("org/digits-run")
    assert json.loads((repo / "last-checkpoint" / "federated_state.json").read_text())["round"] == 2
    card = ModelCard.load(repo / "README.md")
    assert "in progress" not in card.text and card.data.eval_results[0].metric_value == pytest.approx(
        output.history[-1]["eval_accuracy"], abs=1e-6)
    torch.testing.assert_close(load_model(repo).backbone.fc2.weight, model.backbone.fc2.weight, rtol=0, atol=0)
    assert callback.result.repo_id == "org/digits-run"
    assert not [p for p in out.iterdir() if p.name.startswith(".hub-staging-")]

    assert list(out.rglob("events.out.tfevents.*")), "the TensorBoard logs are part of what is checked below"
    written = [p for root in (out, fake_hub.root) for p in root.rglob("*") if p.is_file()]
    assert len(written) > 20
    leaks = [str(p) for p in written if SENTINEL.encode() in p.read_bytes()]
    assert leaks == []
    captured = capsys.readouterr()
    assert SENTINEL not in caplog.text + captured.out + captured.err


def test_push_refuses_a_truncated_final_model(tmp_path):
    """A final_model/ that no longer matches its completion marker is not pushed."""
    from unittest import mock

    t, output = run(tmp_path, fed_algorithm="fedavg", num_rounds=1, local_steps=1)  # a run's final model
    final = Path(output.final_model_dir)
    data = (final / "model.safetensors").read_bytes()
    (final / "model.safetensors").write_bytes(data[:100])
    api = mock.MagicMock()
    with pytest.raises(IncompleteSaveError, match="model.safetensors"):
        push_final_model(final, t.args, api=api)
    api.create_repo.assert_not_called()
    api.upload_folder.assert_not_called()
