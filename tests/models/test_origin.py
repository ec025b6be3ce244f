"""A model's Hub origin (``hf_fedflat.models.origin``): a Hub id as given, a Hub-cache folder (repository and commit,
exact), a folder whose config or card names where it came from (the card's base_model only), else no origin and
an absolute path for an adapter's base."""

from __future__ import annotations

import json
import os

from hf_fedflat.models.origin import ModelOrigin, base_model_reference, model_origin


def test_hub_id_and_cache_folder_are_exact(tmp_path, monkeypatch):
    assert model_origin("openai-community/gpt2") == ModelOrigin("openai-community/gpt2", None, exact=True)
    snapshot = tmp_path / "hub" / "models--openai-community--gpt2" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    assert model_origin(snapshot) == ModelOrigin("openai-community/gpt2", "abc123", exact=True)
    assert base_model_reference(snapshot) == ("openai-community/gpt2", "abc123")


def test_recorded_names_give_the_card_an_origin_but_the_adapter_a_path(tmp_path, monkeypatch):
    folder = tmp_path / "fine_tuned"
    folder.mkdir()
    assert model_origin(folder) == ModelOrigin()  # nothing recorded
    (folder / "README.md").write_text("---\nbase_model: google-bert/bert-base-uncased\n---\n# a model\n")
    assert model_origin(folder) == ModelOrigin("google-bert/bert-base-uncased", None, exact=False)
    (folder / "config.json").write_text(json.dumps({"_name_or_path": "distilbert/distilbert-base-uncased"}))
    assert model_origin(folder).hub_id == "distilbert/distilbert-base-uncased"  # the config first
    (folder / "config.json").write_text(json.dumps({"_name_or_path": str(tmp_path / "elsewhere")}))
    assert model_origin(folder).hub_id == "google-bert/bert-base-uncased"  # a path is no Hub id
    monkeypatch.chdir(tmp_path)
    # the weights may have changed since: an adapter points at the folder itself, by its absolute path
    assert base_model_reference("fine_tuned") == (os.path.join(str(tmp_path), "fine_tuned"), None)
