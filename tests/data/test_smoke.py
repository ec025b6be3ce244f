"""Every dataset's ``--smoke`` data (``hf_fedflat.data.smoke``): tiny local files in the real formats that train
two rounds offline."""

from __future__ import annotations

import json
import math

import pytest


@pytest.mark.parametrize("name, model, extra", [
    ("femnist", "small_cnn", {}),
    ("celeba", "small_cnn", {}),
    ("synthetic", "logistic", {"image_size": 1}),
    ("tiny_imagenet", "small_cnn", {}),
])
def test_smoke_two_rounds_offline(tmp_path, name, model, extra):
    from hf_fedflat import FedTrainingArguments
    from hf_fedflat.data.arguments import DataArguments
    from hf_fedflat.cli.experiment import build_experiment
    from hf_fedflat.models.arguments import ModelArguments

    args = FedTrainingArguments(output_dir=str(tmp_path), use_cpu=True, num_rounds=2, num_clients=4,
                                clients_per_round=2, local_steps=2, per_device_train_batch_size=4, disable_tqdm=True,
                                report_to=[])
    experiment = build_experiment(DataArguments(dataset_name=name, smoke=True),
                                  ModelArguments(model_name=model, image_size=extra.get("image_size", 16)), args)
    partition = experiment.data.partition
    if name != "tiny_imagenet":  # the natural clients (the users of the written LEAF files) set num_clients
        files = (tmp_path / "smoke_data" / name).glob("train/*.json")
        written = sum(len(json.loads(p.read_text())["users"]) for p in files)
        assert experiment.args.num_clients == partition.num_clients == written
    experiment.trainer.train()
    history = experiment.trainer.history
    assert [r["round"] for r in history] == [1, 2] and all(math.isfinite(r["eval_loss"]) for r in history)
    assert (tmp_path / "final_model" / "config.json").is_file()
