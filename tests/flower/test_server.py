"""The ServerApp's rounds with real ClientApps (in this process): the same final model as ``hf-fedflat train``."""

from __future__ import annotations

import json
import os

import pytest

from helpers.flower import final_weights, max_difference, run_in_process, train_builtin

pytest.importorskip("flwr")

PRESETS = ["fedavg", "scaffold", "fedlesam_d", "fedgam_cv", "fedavg+fedgh", "fedgloss"]


def _both_runs(tmp_path, **changes) -> tuple[list[dict], list[dict]]:
    """``hf-fedflat train`` and the ServerApp's rounds of the same settings: ``(built-in history, Flower history)``,
    after checking that their final weights are the same bit for bit."""
    builtin = train_builtin(tmp_path, **changes)
    flower, _ = run_in_process(tmp_path, **changes)
    assert max_difference(final_weights(builtin), final_weights(flower)) == 0.0
    histories = []
    for output in (builtin, flower):
        with open(os.path.join(output, "history.json")) as f:
            histories.append(json.load(f))
    return histories[0], histories[1]


@pytest.mark.parametrize("algorithm", PRESETS)
def test_flower_rounds_give_the_builtin_model(tmp_path, algorithm):
    """2 of 3 clients sampled each round over 3 rounds (a client's state may skip a round); with every client each
    round the deployments of ``test_deployment.py`` check them too."""
    expected, got = _both_runs(tmp_path, fed_algorithm=algorithm, clients_per_round=2, num_rounds=3)
    assert [r["clients"] for r in got] == [r["clients"] for r in expected]
    assert [r["eval_loss"] for r in got] == [r["eval_loss"] for r in expected]
    # what each node received and sent, per round: the packed payload down, the update and messages up
    for record in got:
        assert sorted(record["node_bytes"]) == sorted(str(c) for c in record["clients"])
        assert all(down > 0 and up > 0 for down, up in record["node_bytes"].values())


def test_client_level_dp_noise_is_added_on_the_nodes_as_in_the_builtin_run(tmp_path):
    """``dp_fedsam`` adds each client's noise in the client's own code, here on its node: the deployed run gives
    ``hf-fedflat train``'s model and the same epsilon after every round (Poisson-sampled clients included)."""
    expected, got = _both_runs(tmp_path, fed_algorithm="dp_fedsam", clients_per_round=2, num_rounds=3)
    assert [r["clients"] for r in got] == [r["clients"] for r in expected]
    assert [r["dp_epsilon"] for r in got] == [r["dp_epsilon"] for r in expected] and got[-1]["dp_epsilon"] > 0


def test_strategy_from_python_arguments_gives_the_builtin_model(tmp_path):
    """A ServerApp and ClientApp of a user's own: ``FedFlatStrategy.from_arguments(...)`` started on the grid, the
    nodes' ``client_app(settings=...)`` given the same arguments' settings (their App declares none): the model of
    ``hf-fedflat train`` for the same run, bit for bit."""
    from hf_fedflat.config import FedTrainingArguments
    from hf_fedflat.data.arguments import DataArguments
    from hf_fedflat.flower import FedFlatStrategy, arguments_settings
    from hf_fedflat.models.arguments import ModelArguments

    from helpers.flower import RUN_CONFIG, InProcessGrid

    data_fields, model_fields = {"dataset_name"}, {"model_name", "image_size"}
    training = FedTrainingArguments(**{k: v for k, v in RUN_CONFIG.items() if k not in data_fields | model_fields},
                                    fed_algorithm="fedlesam_d", output_dir=str(tmp_path / "flower"))
    data = DataArguments(**{k: RUN_CONFIG[k] for k in data_fields})
    model = ModelArguments(**{k: RUN_CONFIG[k] for k in model_fields})
    settings = arguments_settings(training, data, model)
    strategy = FedFlatStrategy.from_arguments(training, data, model)
    assert strategy.settings == settings
    grid = InProcessGrid(settings, 3, app_has_settings=False)
    output = strategy.start(grid, num_rounds=3, timeout=5.0)
    assert output.final_model_dir == str(tmp_path / "flower" / "final_model")
    builtin = train_builtin(tmp_path, fed_algorithm="fedlesam_d", num_rounds=3)
    assert max_difference(final_weights(builtin), final_weights(tmp_path / "flower")) == 0.0
