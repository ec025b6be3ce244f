"""FedTrainingArguments: parsing from CLI/YAML/JSON, defaults, and bad values of the federated fields (a
disconnected gossip graph included) failing early and clearly. The inherited Trainer fields' checks are tested in
``tests/test_trainer_fields.py``."""

from __future__ import annotations

import json

import pytest
from transformers import HfArgumentParser

from hf_fedflat import FedTrainingArguments, list_algorithms

BASE = dict(output_dir="/tmp/hf_fedflat_config_test", use_cpu=True)


def make(**kwargs):
    return FedTrainingArguments(**{**BASE, **kwargs})


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"fed_algorithm": "fedmagic"}, "fed_algorithm"),
        ({"num_clients": 0}, "num_clients"),
        ({"num_clients": 10, "clients_per_round": 11}, "clients_per_round"),
        ({"clients_per_round": 5, "participation_fraction": 0.5}, "clients_per_round"),
        ({"participation_fraction": 1.5}, "participation_fraction"),
        ({"participation_fraction": 0.0}, "participation_fraction"),
        ({"rho": -0.1}, "rho"),
        ({"dirichlet_alpha": 0.0}, "dirichlet_alpha"),
        ({"dirichlet_alpha": -1.0}, "dirichlet_alpha"),
        ({"num_rounds": 0}, "num_rounds"),
        ({"local_epochs": 0.0}, "local_epochs"),
        ({"local_steps": 0}, "local_steps"),
        ({"server_learning_rate": 0.0}, "server_learning_rate"),
        ({"lr_decay_per_round": 1.5}, "lr_decay_per_round"),
        ({"lr_decay_per_round": 0.0}, "lr_decay_per_round"),
        ({"aggregation_weights": "by_size"}, "aggregation_weights"),
        ({"partition_scheme": "zipf"}, "partition_scheme"),
        ({"classes_per_client": 0}, "classes_per_client"),
        ({"min_partition_size": 0}, "min_partition_size"),
        ({"client_state_store": "redis"}, "client_state_store"),
        ({"save_every_n_rounds": -1}, "save_every_n_rounds"),
        ({"num_rounds": 5, "save_every_n_rounds": 10}, "save_every_n_rounds"),
        ({"max_steps": 100}, "max_steps"),
        ({"perturbation": "sharp"}, "perturbation"),
        ({"corrections": "scaffold,magic"}, "corrections"),
        ({"aggregator": "median"}, "aggregator"),
        ({"learning_rate": float("nan")}, "learning_rate"),
        ({"eval_every_n_rounds": 0}, "eval_every_n_rounds"),
        ({"batchnorm_buffers": "freeze"}, "batchnorm_buffers"),
        ({"fed_algorithm": "fedavg+fedmagic"}, "fed_algorithm"),
        ({"gam_alpha": -0.2}, "gam_alpha"),
        ({"gam_gamma": 1.5}, "gam_gamma"),
        ({"lesam_direction": "sideways"}, "lesam_direction"),
        ({"prox_mu": float("inf")}, "prox_mu"),
        ({"momentum_alpha": 2.0}, "momentum_alpha"),
        ({"server_beta1": 1.0}, "server_beta1"),
        ({"fed_algorithm": "fedlesam_s+fedgh", "num_clients": 10, "clients_per_round": 1}, "clients_per_round"),
        ({"diagnostics": "sharpness,vibes"}, "diagnostics"),
        ({"diagnostics": "perturbation_drift"}, "diagnostics"),
        ({"loss_surface_resolution": 1}, "loss_surface_resolution"),
        ({"target_accuracy": 1.5}, "target_accuracy"),
        ({"topology": "hypercube"}, "topology"),
        ({"topology": "graph"}, "topology_edges"),
        ({"gossip_steps": 0}, "gossip_steps"),
        ({"decentralized_participation": "some"}, "decentralized_participation"),
        ({"max_update_norm": 0.0}, "max_update_norm"),
        ({"round_deadline_seconds": -1.0}, "round_deadline_seconds"),
        ({"max_consecutive_failed_rounds": -1}, "max_consecutive_failed_rounds"),
    ],
)
def test_bad_configuration_names_the_field(overrides, field):
    with pytest.raises(ValueError, match=f"^{field}"):
        make(**overrides)


def test_unknown_algorithm_lists_the_available_ones():
    with pytest.raises(ValueError) as error:
        make(fed_algorithm="fedmagic")
    for name in list_algorithms():
        assert name in str(error.value)


def test_defaults_follow_the_papers():
    args = make()
    assert args.optim == "sgd" and args.lr_scheduler_type == "constant" and args.max_grad_norm == 10.0
    assert args.num_clients_per_round == 10  # 10% of 100
    assert make(fed_algorithm="fedsam").rho == 0.05
    assert make(fed_algorithm="fedsam", rho=0.3).rho == 0.3
    assert make(num_clients=20, participation_fraction=0.25).num_clients_per_round == 5
    assert make(seed=3).effective_partition_seed == 3 and make(seed=3, partition_seed=9).effective_partition_seed == 9


def test_every_field_has_help():
    import dataclasses

    from transformers import TrainingArguments

    own = {f.name for f in dataclasses.fields(FedTrainingArguments)} - {f.name for f in dataclasses.fields(TrainingArguments)}
    overridden = {"learning_rate", "optim", "lr_scheduler_type", "max_grad_norm", "per_device_train_batch_size",
                  "remove_unused_columns"}
    for f in dataclasses.fields(FedTrainingArguments):
        if f.name in own | overridden:
            assert f.metadata.get("help"), f.name


def test_parse_from_cli_yaml_and_json(tmp_path):
    parser = HfArgumentParser(FedTrainingArguments)
    (cli,) = parser.parse_args_into_dataclasses(
        ["--output_dir", str(tmp_path), "--use_cpu", "true", "--fed_algorithm", "fedgamma", "--num_clients", "20",
         "--clients_per_round", "4", "--rho", "0.1", "--num_rounds", "3"]
    )
    assert (cli.fed_algorithm, cli.num_clients, cli.num_clients_per_round, cli.rho) == ("fedgamma", 20, 4, 0.1)

    config = {"output_dir": str(tmp_path), "use_cpu": True, "fed_algorithm": "scaffold", "num_clients": 12,
              "participation_fraction": 0.5, "dirichlet_alpha": 0.7, "scaffold_lambda": 0.5}
    (tmp_path / "run.json").write_text(json.dumps(config))
    (from_json,) = parser.parse_json_file(str(tmp_path / "run.json"))
    yaml_text = "\n".join(f"{k}: {json.dumps(v)}" for k, v in config.items())
    (tmp_path / "run.yaml").write_text(yaml_text)
    (from_yaml,) = parser.parse_yaml_file(str(tmp_path / "run.yaml"))
    for parsed in (from_json, from_yaml):
        assert (parsed.fed_algorithm, parsed.num_clients_per_round, parsed.dirichlet_alpha, parsed.scaffold_lambda) == (
            "scaffold", 6, 0.7, 0.5)


def test_bad_value_from_the_command_line_fails_before_anything_loads(tmp_path):
    parser = HfArgumentParser(FedTrainingArguments)
    with pytest.raises(ValueError, match="clients_per_round"):
        parser.parse_args_into_dataclasses(
            ["--output_dir", str(tmp_path), "--use_cpu", "true", "--num_clients", "4", "--clients_per_round", "8"]
        )


def test_every_piece_hyperparameter_is_a_flag_resolved_from_the_preset_then_the_piece():
    import dataclasses

    from hf_fedflat.algorithms.registry import hyperparameter_fields

    names = {f.name for f in dataclasses.fields(FedTrainingArguments)}
    assert {f.name for f in hyperparameter_fields()} <= names
    assert {"rho", "prox_mu", "server_beta1", "topology", "gossip_steps"} <= names  # gossip registered before config
    gam = make(fed_algorithm="fedgam")
    assert (gam.rho, gam.gam_alpha) == (0.02, 0.2) and gam.prox_mu is None  # a piece this run does not use: unset
    assert gam.algorithm_hyperparameters() == {"rho": 0.02, "gam_alpha": 0.2, "server_learning_rate": 1.0}
    sam = gam.with_algorithm("fedsam")  # values taken from defaults go back to unset
    assert sam.rho == 0.05 and sam.gam_alpha is None
    assert make(fed_algorithm="fedgam", rho=0.3).with_algorithm("fedsam").rho == 0.3  # the user's value stays


def test_a_launch_that_did_not_open_the_process_group_is_told_the_call(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match=r"hf_fedflat\.init_process_group\(\)"):
        make()


def test_a_bool_piece_hyperparameter_is_a_bare_flag_as_before(tmp_path):
    """``--topology_redraw`` alone means true (its field is Optional, unset = the piece's own default)."""
    parser = HfArgumentParser(FedTrainingArguments)
    base = ["--output_dir", str(tmp_path), "--fed_algorithm", "dfedavg"]
    for extra, expected in (([], False), (["--topology_redraw"], True), (["--topology_redraw", "false"], False)):
        (args,) = parser.parse_args_into_dataclasses(base + extra)
        assert args.topology_redraw is expected


def test_a_disconnected_gossip_graph_is_refused(tmp_path):
    edges = tmp_path / "edges.json"
    edges.write_text(json.dumps([[0, 1], [2, 3]]))  # two pieces: spectral gap 0
    base = dict(output_dir=str(tmp_path / "out"), fed_algorithm="dfedavg", topology="graph", num_clients=4,
                clients_per_round=2)
    with pytest.raises(ValueError, match=r"^topology_edges: .* does not connect all 4 clients \(spectral gap 0\)"):
        FedTrainingArguments(**base, topology_edges=str(edges))
    edges.write_text(json.dumps([[0, 1], [1, 2]]))  # client 3 alone
    with pytest.raises(ValueError, match="^topology_edges: "):
        FedTrainingArguments(**base, topology_edges=str(edges))
    edges.write_text(json.dumps([[0, 1], [1, 2], [2, 3]]))  # a path: connected
    assert FedTrainingArguments(**base, topology_edges=str(edges)).topology_edges == str(edges)
