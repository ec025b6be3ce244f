"""Recipes run end to end with tiny arguments (their `main()` is called like the CLI would)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_recipe(name: str):
    spec = importlib.util.spec_from_file_location(f"recipe_{name}", ROOT / "recipes" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


TINY = ["--num_clients", "6", "--clients_per_round", "3", "--num_rounds", "2", "--use_cpu", "true",
        "--disable_tqdm", "true", "--image_size", "8"]


def test_quickstart_compares_algorithms_into_subfolders(tmp_path):
    quickstart = load_recipe("quickstart")
    rows = quickstart.main(["--output_dir", str(tmp_path), "--compare", "fedavg,fedsam", *TINY])
    assert [r["algorithm"] for r in rows] == ["fedavg", "fedsam"]
    for name in ("fedavg", "fedsam"):
        history = json.loads((tmp_path / name / "history.json").read_text())
        assert len(history) == 2 and 0.0 <= history[-1]["eval_accuracy"] <= 1.0
        assert (tmp_path / name / "final_model" / "model.safetensors").exists()
    table = (tmp_path / "results.md").read_text()
    assert "| fedavg |" in table and "| fedsam |" in table


def test_quickstart_single_algorithm_writes_into_output_dir(tmp_path):
    quickstart = load_recipe("quickstart")
    rows = quickstart.main(["--output_dir", str(tmp_path), "--fed_algorithm", "scaffold", *TINY])
    assert [r["algorithm"] for r in rows] == ["scaffold"]
    assert (tmp_path / "final_model" / "config.json").exists()
    assert json.loads((tmp_path / "final_model" / "federated_config.json").read_text())["algorithm"]["corrections"] == ["scaffold"]


def test_quickstart_reads_a_yaml_config(tmp_path):
    quickstart = load_recipe("quickstart")
    config = tmp_path / "run.yaml"
    config.write_text(
        f"output_dir: {tmp_path / 'out'}\nfed_algorithm: fedgamma\nnum_clients: 6\nclients_per_round: 2\n"
        "num_rounds: 1\nuse_cpu: true\ndisable_tqdm: true\nimage_size: 8\nrho: 0.1\n"
    )
    rows = quickstart.main([str(config)])
    assert rows[0]["algorithm"] == "fedgamma"
    assert (tmp_path / "out" / "history.json").exists()
