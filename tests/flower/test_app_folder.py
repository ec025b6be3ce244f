"""``hf-fedflat flower-app``: the App folder, its settings, what it refuses; and the App's light ClientApp."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib

import pytest
import yaml

from helpers.flower import RUN_CONFIG

pytest.importorskip("flwr")

from hf_fedflat.cli.commands import flower_app_main, flower_local_main  # noqa: E402


def _write(tmp_path, **changes) -> str:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({**RUN_CONFIG, **changes}))
    return str(path)


def test_the_app_holds_the_components_and_every_setting(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = _write(tmp_path, output_dir="outputs/run", model_kwargs='{"hidden_dim": 8}', metrics="accuracy,f1")
    assert flower_app_main(["--config", config, "--output", "my_app", "--num_rounds", "7"]) == 0
    pyproject = tomllib.loads((tmp_path / "my_app" / "pyproject.toml").read_text())
    app = pyproject["tool"]["flwr"]["app"]
    assert app["components"] == {"serverapp": "my_app.apps:server", "clientapp": "my_app.apps:client"}
    settings = app["config"]
    assert settings["num_rounds"] == 7  # the flag wins over the file, as for hf-fedflat train
    assert settings["model_kwargs"] == '{"hidden_dim": 8}' and settings["metrics"] == "accuracy,f1"
    assert settings["output_dir"] == str(tmp_path / "outputs" / "run")  # absolute: the ServerApp runs elsewhere
    assert settings["resume_from_checkpoint"] == ""  # present, so that flwr run --run-config can set it
    assert settings["flower_reply_timeout"] == 600.0 and settings["flower_connect_timeout"] == 300.0
    for key, value in RUN_CONFIG.items():
        if key != "num_rounds":
            assert settings[key] == value, key


def test_settings_parse_back_to_what_hf_fedflat_train_parses(tmp_path):
    from hf_fedflat.cli.parsing import parse_train_args
    from hf_fedflat.flower.settings import app_settings, parse_run_config

    values = {**RUN_CONFIG, "output_dir": str(tmp_path / "out"), "generation_prompts": None, "lr_decay_per_round": 0.99,
              "corrections": "prox", "prox_mu": 0.01}
    direct = parse_train_args(["--config", _write(tmp_path, **values)])
    through_app = parse_run_config({**app_settings(values), "flower_reply_timeout": 5.0})
    for ours, theirs in zip(direct, through_app):
        assert (ours.to_dict() == theirs.to_dict()) if hasattr(ours, "to_dict") else (vars(ours) == vars(theirs))


def test_lists_and_mappings_travel_as_json_strings():
    from hf_fedflat.flower.settings import app_settings, run_config_values

    values = {"report_to": ["tensorboard", "trackio"], "model_kwargs": {"a": 1}, "seed": 3, "flag": True,
              "unset": None}
    settings = app_settings(values)
    assert settings == {"report_to": 'json:["tensorboard", "trackio"]', "model_kwargs": 'json:{"a": 1}', "seed": 3,
                        "flag": True, "unset": ""}
    assert run_config_values(settings) == {k: v for k, v in values.items() if v is not None}


@pytest.mark.parametrize("changes, line", [
    ({"fed_algorithm": "dfedavg"}, "error: fed_algorithm: 'dfedavg' is decentralized"),
    ({"learning_rate": -1.0}, "error: learning_rate"),
])
def test_bad_settings_are_one_line_and_exit_2(tmp_path, capsys, changes, line):
    assert flower_app_main(["--config", _write(tmp_path, **changes), "--output", str(tmp_path / "app")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("hf-fedflat flower-app: " + line), err
    assert not (tmp_path / "app").exists()


def test_flower_local_refuses_an_app_folder_without_pyproject(tmp_path, capsys):
    assert flower_local_main(["--app", str(tmp_path), "--supernodes", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"hf-fedflat flower-local: error: --app: {tmp_path} holds no pyproject.toml (write one with " \
                  "hf-fedflat flower-app)."


def test_the_app_module_imports_neither_torch_nor_hf_fedflat(tmp_path):
    """Flower starts a ClientApp process per message: the App's module loads the relay by its file."""
    assert flower_app_main(["--config", _write(tmp_path), "--output", str(tmp_path / "app")]) == 0
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import app.apps as apps; "
            "print(type(apps.client).__name__, type(apps.server).__name__, 'torch' in sys.modules, "
            "'hf_fedflat' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "app")], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": ""})
    assert done.stdout.split() == ["ClientApp", "ServerApp", "False", "False"], done.stderr
