"""The ``hf-fedflat`` command, called in-process: train from YAML, compare runs, partition a dataset."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from huggingface_hub import ModelCard

from hf_fedflat import list_algorithms
from hf_fedflat.cli import main, parse_train_args
from hf_fedflat.data import load_digits_dataset, partition_dataset
from hf_fedflat.data.arguments import DataArguments
from hf_fedflat.data.catalog import DATASETS, load_data
from hf_fedflat.models.arguments import ModelArguments

from helpers import REPO_ROOT

CONFIGS = sorted((REPO_ROOT / "recipes" / "configs").glob("*.yaml"))


def test_train_from_yaml_with_flag_overrides_and_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({
        "dataset_name": "digits", "test_fraction": 0.05, "model_name": "small_cnn", "image_size": 8,
        "output_dir": str(tmp_path / "out"),
        "fed_algorithm": "fedsam", "num_clients": 4, "clients_per_round": 2, "num_rounds": 1, "local_steps": 2,
        "per_device_train_batch_size": 8, "partition_scheme": "iid", "report_to": ["tensorboard"], "use_cpu": True,
        "disable_tqdm": True, "learning_rate": 0.05,
    }))
    assert main(["train", "--config", str(config), "--num_rounds", "2"]) == 0  # the flag wins over the file

    out = tmp_path / "out"
    history = json.loads((out / "history.json").read_text())
    assert [r["round"] for r in history] == [1, 2]
    card = ModelCard.load(out / "final_model" / "README.md")
    assert "fedsam" in card.data.tags and card.data.eval_results[0].dataset_name == "digits"
    assert card.data.model_name == "digits-small_cnn-fedsam"
    assert json.loads((out / "final_model" / "federated_config.json").read_text())["algorithm"]["perturbation"] == "sam"

    event_dirs = {p.parent for p in out.rglob("events.out.tfevents.*")}
    assert len(event_dirs) == 1
    events = EventAccumulator(str(event_dirs.pop()))
    events.Reload()
    scalars = events.Scalars("eval/accuracy")
    assert [e.step for e in scalars] == [1, 2]  # exactly one point per round
    np.testing.assert_allclose([e.value for e in scalars], [r["eval_accuracy"] for r in history], rtol=1e-6)


def test_train_refuses_unknown_config_keys(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text("num_round: 3\n")
    assert main(["train", "--config", str(config)]) == 2  # one line, as argparse does for an unknown flag
    assert "hf-fedflat train: error: config: unknown field(s) num_round in " in capsys.readouterr().err


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_configs_parse(path):
    data_args, model_args, _, args = parse_train_args(["--config", str(path)])
    values = yaml.safe_load(path.read_text())
    assert args.fed_algorithm == values["fed_algorithm"] in list_algorithms()
    assert data_args.dataset_name == values["dataset_name"] in DATASETS
    assert (model_args.model_name, model_args.image_size) == (values["model_name"], values["image_size"])
    assert args.num_rounds == values["num_rounds"] and args.output_dir == values["output_dir"]
    if "model_kwargs" in values:
        assert model_args.model_kwargs_dict == values["model_kwargs"]


def write_run(path: Path, accuracies: list[float], algorithm: str, seconds: float) -> None:
    path.mkdir(parents=True)
    history = [{"round": i + 1, "eval_accuracy": a, "eval_loss": 1.0 - a, "train_loss": 1.1 - a,
                "round_seconds": seconds, "wall_seconds": seconds * (i + 1)} for i, a in enumerate(accuracies)]
    (path / "history.json").write_text(json.dumps(history))
    (path / "final_model").mkdir()
    (path / "final_model" / "federated_config.json").write_text(json.dumps({"algorithm": {"name": algorithm}}))


def test_compare_prints_a_table_and_writes_png_and_csv(tmp_path, capsys):
    runs = tmp_path / "runs"
    write_run(runs / "a", [0.5, 0.8, 0.7], "fedavg", 0.5)
    write_run(runs / "b", [0.6, 0.65, 0.9, 0.85], "fedsam", 1.0)
    (runs / "notes").mkdir()  # not a run: skipped
    assert main(["compare", str(runs / "*"), "--out_dir", str(tmp_path / "cmp")]) == 0
    table = capsys.readouterr().out
    assert "| a | fedavg | 3 | 0.7000 | 0.8000 (2) | 0.50 | 1.5 |" in table
    assert "| b | fedsam | 4 | 0.8500 | 0.9000 (3) | 1.00 | 4.0 |" in table
    with open(tmp_path / "cmp" / "comparison.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["run"], float(r["final"]), float(r["best"]), int(r["best_round"])) for r in rows] == [
        ("a", 0.7, 0.8, 2), ("b", 0.85, 0.9, 3)]
    assert (tmp_path / "cmp" / "comparison.png").read_bytes().startswith(b"\x89PNG")

    # a folder of runs stands for its runs; losses are compared by their minimum
    assert main(["compare", str(runs), "--metric", "eval_loss", "--out_dir", str(tmp_path / "cmp2")]) == 0
    assert "| a | fedavg | 3 | 0.3000 | 0.2000 (2) |" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["compare", str(tmp_path / "nothing-here")])


def test_partition_prints_the_summary_and_writes_the_heatmap(tmp_path, capsys):
    png, saved = tmp_path / "partition.png", tmp_path / "partition.json"
    argv = ["partition", "--dataset", "digits", "--num_clients", "20", "--partition_scheme", "dirichlet",
            "--dirichlet_alpha", "0.3", "--plot", str(png), "--json", str(saved)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "dirichlet(alpha=0.3), seed 42: 20 clients, 1437 samples, 10 classes" in printed
    assert png.read_bytes().startswith(b"\x89PNG") and png.stat().st_size > 5000
    expected = partition_dataset(load_digits_dataset(seed=42)["train"], 20, "dirichlet", alpha=0.3, seed=42)
    assert json.loads(saved.read_text())["label_counts"] == expected.label_counts.tolist()


def test_usage_list_and_unknown_names(capsys):
    assert main([]) == 2
    assert main(["--help"]) == 0
    assert main(["fly"]) == 2
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "fedavg" in out and ("datasets: celeba, cifar10, cifar100, digits, domainnet, fashion_mnist, femnist, mnist, officehome, "
                                  "reddit, sent140, shakespeare, synthetic, tiny_imagenet") in out
    with pytest.raises(ValueError, match=r"^dataset_name: 'nope' is not a registered dataset \(available: celeba, cifar10, cifar100, digits, "):
        load_data(DataArguments(dataset_name="nope"), ModelArguments(), seed=0)
    with pytest.raises(ValueError, match="^model_kwargs: must be a JSON object"):
        ModelArguments(model_kwargs="[1, 2]").model_kwargs_dict


def test_partition_shows_a_datasets_own_partition(tmp_path, capsys):
    """A dataset with a natural partition (here LEAF Synthetic's users) is summarized as a run would use it."""
    from hf_fedflat.data.arguments import DataArguments as Data

    assert main(["partition", "--dataset", "synthetic", "--image_size", "1", "--num_clients", "7",
                 "--json", str(tmp_path / "p.json")]) == 0
    out = capsys.readouterr().out
    expected = load_data(Data(dataset_name="synthetic"), ModelArguments(image_size=1), seed=42).partition
    assert f"synthetic comes with its own partition ({expected.num_clients} clients)" in out
    saved = json.loads((tmp_path / "p.json").read_text())
    assert len(saved["client_indices"]) == expected.num_clients != 7
    assert saved["client_indices"] == [list(map(int, c)) for c in expected.client_indices]
