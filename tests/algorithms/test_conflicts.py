"""Settings that contradict the algorithm are refused naming the fields (exit status 2 from the command line);
hyperparameters given that no piece reads are warned about once; the name a run is recorded under is what ran."""

from __future__ import annotations

import json
import logging

import pytest

from hf_fedflat import FedTrainingArguments, build_algorithm, cli, create_trainer
from hf_fedflat.algorithms import conflicts
from hf_fedflat.algorithms.registry import PRESETS, AlgorithmSpec
from hf_fedflat.cli.comparison import run_comparison
from hf_fedflat.cli.parsing import parse_arguments
from hf_fedflat.cli.summary import summarize_run
from hf_fedflat.cli.sweep import expand_members
from hf_fedflat.field_checks import ConfigError

from conftest import TinyClassifier, make_tiny_dataset

TRAIN = make_tiny_dataset(n=48, seed=1)
TEST = make_tiny_dataset(n=12, seed=2)


def arguments(tmp_path, **settings) -> FedTrainingArguments:
    return FedTrainingArguments(output_dir=str(tmp_path / "run"), use_cpu=True, num_clients=4, clients_per_round=2,
                                num_rounds=1, local_steps=1, per_device_train_batch_size=4, disable_tqdm=True,
                                report_to="none", **settings)


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(conflicts, "_WARNED", set())  # "once" is per process: each test starts afresh


# --- refused ----------------------------------------------------------------------------------------------
REFUSED = [
    # a decentralized preset with a server rule: ran as centralized FedAdam under dfedgam's name
    (dict(fed_algorithm="dfedgam", aggregator="fedadam"),
     r"^aggregator: 'fedadam' updates a global model on a server, but fed_algorithm 'dfedgam' is a decentralized "
     r"algorithm .*--fed_algorithm fedavg --perturbation gam_first_order --aggregator fedadam\.$"),
    # a server preset made decentralized by its aggregator
    (dict(fed_algorithm="fedsam", aggregator="gossip"),
     r"^aggregator: 'gossip' is decentralized .* but fed_algorithm 'fedsam' is a server algorithm .*"
     r"--fed_algorithm dfedavg --perturbation sam\.$"),
    # the gossip flags and the decentralized participation on a server run
    (dict(fed_algorithm="fedavg", topology="ring"), r"^topology: given, but it is a setting of decentralized runs"),
    (dict(fed_algorithm="fedavg", topology="ring", topology_degree=3, gossip_steps=2),
     r"^gossip_steps, topology, topology_degree: given, but they are settings of decentralized runs"),
    (dict(fed_algorithm="scaffold", decentralized_participation="full"),
     r"^decentralized_participation: given, but it is a setting of decentralized runs .* scaffold has a server"),
    # a server rule's settings on a decentralized run
    (dict(fed_algorithm="dfedavg", server_learning_rate=0.5),
     r"^server_learning_rate: given, but it is a setting of server runs .* dfedavg is decentralized"),
    (dict(fed_algorithm="dfedsam", server_beta1=0.8), r"^server_beta1: given, but it is a setting of server runs"),
    # plug-ins and server state have no server to run on
    (dict(fed_algorithm="dfedavg+fedgh"), r"^fed_algorithm: the plug-in\(s\) \+fedgh transform the updates"),
    (dict(fed_algorithm="dfedavg", aggregator="gossip+fedgh"), r"^aggregator: the plug-in\(s\) \+fedgh"),
    (dict(fed_algorithm="dfedavg", corrections="scaffold"), r"^corrections: scaffold needs server-side state"),
    (dict(fed_algorithm="dfedsam", perturbation="lesam", lesam_direction="last_global_update"),
     r"^perturbation: lesam needs server-side state"),
]


@pytest.mark.parametrize("settings, message", REFUSED, ids=[str(s) for s, _ in REFUSED])
def test_contradicting_settings_are_refused_naming_the_fields(tmp_path, settings, message):
    args = arguments(tmp_path, **settings)
    with pytest.raises(ConfigError, match=message):
        args.check_algorithm_settings()
    with pytest.raises(ValueError, match=message):  # every run checks when it builds its algorithm
        build_algorithm(args)


@pytest.mark.parametrize("settings", [
    dict(fed_algorithm="dfedavg", topology="ring", decentralized_participation="sampled", gossip_steps=2),
    dict(fed_algorithm="dfedavg", perturbation="gam"),            # any perturbation on gossip: a decentralized run
    dict(fed_algorithm="dfedsam", corrections="prox"),             # a correction without server state
    dict(fed_algorithm="fedavg", aggregator="fednova+fedgh", server_learning_rate=0.5),  # same kind, another rule
    dict(fed_algorithm="fedavg", perturbation="sam", rho=0.1),     # the part given reads the hyperparameter
    dict(fed_algorithm="fedavg", rho=0.1, diagnostics="sharpness"),  # the sharpness diagnostic's radius
])
def test_consistent_settings_pass_without_a_word(tmp_path, caplog, settings):
    with caplog.at_level(logging.WARNING, logger="hf_fedflat"):
        arguments(tmp_path, **settings).check_algorithm_settings()
    assert not caplog.records


def test_the_kind_is_read_from_the_pieces_not_the_name(tmp_path, monkeypatch):
    """A preset named like a server algorithm whose aggregator is gossip is decentralized, and the other way round."""
    monkeypatch.setitem(PRESETS, "fedlike", AlgorithmSpec("fedlike", "none", (), "gossip", "gossip, a server's name"))
    monkeypatch.setitem(PRESETS, "dlike", AlgorithmSpec("dlike", "none", (), "mean", "a server rule"))
    with pytest.raises(ConfigError, match="^aggregator: 'mean' updates a global model on a server, but fed_algorithm "
                                          "'fedlike' is a decentralized algorithm"):
        arguments(tmp_path, fed_algorithm="fedlike", aggregator="mean").check_algorithm_settings()
    with pytest.raises(ConfigError, match="^topology: given, but it is a setting of decentralized runs"):
        arguments(tmp_path, fed_algorithm="dlike", topology="ring").check_algorithm_settings()
    arguments(tmp_path, fed_algorithm="fedlike", topology="ring").check_algorithm_settings()


def test_the_cli_refuses_before_anything_loads(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("hf_fedflat.cli.experiment.run_experiment",
                        lambda *a, **k: pytest.fail("no experiment may start on contradicting settings"))
    out = tmp_path / "run"
    status = cli.main(["train", "--dataset_name", "digits", "--output_dir", str(out), "--fed_algorithm", "dfedgam",
                       "--aggregator", "fedadam"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and err[0].startswith("hf-fedflat train: error: aggregator: 'fedadam' ")
    assert not out.exists()


def test_every_comparison_member_is_checked_before_the_first_trains(tmp_path):
    def never(*args, **kwargs):
        raise AssertionError("a member trained before every member was checked")

    args = arguments(tmp_path, aggregator="fedadam")
    with pytest.raises(ConfigError, match="^aggregator: 'fedadam' .* fed_algorithm 'dfedgam'"):
        run_comparison(args, ["fedavg", "dfedgam"], TinyClassifier, TRAIN, TEST, label_column="labels",
                       trainer_factory=never)
    with pytest.raises(ConfigError, match="not a known algorithm"):
        run_comparison(args, ["fedavg", "fedavgg"], TinyClassifier, TRAIN, TEST, label_column="labels",
                       trainer_factory=never)


# --- warned about ------------------------------------------------------------------------------------------
UNREAD = [
    (dict(fed_algorithm="fedavg", rho=0.2), ["rho"], "the perturbations"),
    (dict(fed_algorithm="fedavg", feddyn_alpha=0.1, prox_mu=0.1), ["feddyn_alpha", "prox_mu"], "the correction prox"),
    (dict(fed_algorithm="dfedavg", rho=0.2), ["rho"], "no piece of dfedavg reads it"),
    (dict(fed_algorithm="scaffold", corrections="", scaffold_lambda=0.5), ["scaffold_lambda"],
     "no piece of scaffold (corrections=none) reads it"),
    (dict(fed_algorithm="fedavg", fedgh_mode="sequential"), ["fedgh_mode"], "the plugin fedgh"),
]


@pytest.mark.parametrize("settings, names, text", UNREAD, ids=[str(s) for s, _, _ in UNREAD])
def test_hyperparameters_no_piece_reads_are_warned_about_once(tmp_path, caplog, settings, names, text):
    args = arguments(tmp_path, **settings)
    with caplog.at_level(logging.WARNING, logger="hf_fedflat"):
        args.check_algorithm_settings()
        build_algorithm(args)  # the run checks again: no second warning
        args.with_algorithm(args.fed_algorithm).check_algorithm_settings()
    (record,) = [r for r in caplog.records if "no effect on this run" in r.getMessage()]
    message = record.getMessage()
    assert message.startswith(", ".join(names) + ": given (") and text in message


def test_a_recipes_defaults_are_not_what_the_user_gave(tmp_path, caplog):
    """Only flags and config keys count as given: a recipe's default rho does not make fedavg warn."""
    base = ["--output_dir", str(tmp_path), "--fed_algorithm", "fedavg"]
    with caplog.at_level(logging.WARNING, logger="hf_fedflat"):
        (args,) = parse_arguments([FedTrainingArguments], base, defaults=["--rho", "0.1", "--topology", "ring"])
        args.check_algorithm_settings()
        assert not caplog.records
        (args,) = parse_arguments([FedTrainingArguments], [*base, "--rho", "0.1"])
        args.check_algorithm_settings()
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["rho"]


# --- the name of what ran ------------------------------------------------------------------------------------
LABELS = [
    (dict(fed_algorithm="fedavg"), "fedavg"),
    (dict(fed_algorithm="fedavg", aggregator="mean"), "fedavg"),  # the preset's own part: nothing overridden
    (dict(fed_algorithm="dfedsam", perturbation="gam"), "dfedsam (perturbation=gam)"),
    (dict(fed_algorithm="scaffold", corrections=""), "scaffold (corrections=none)"),
    (dict(fed_algorithm="fedavg+fedgh", aggregator="fednova"), "fedavg+fedgh (aggregator=fednova)"),
    (dict(fed_algorithm="fedavg", perturbation="gam", corrections="prox,scaffold", aggregator="fednova+fedgh"),
     "fedavg (perturbation=gam, corrections=prox,scaffold, aggregator=fednova+fedgh)"),
]


@pytest.mark.parametrize("settings, label", LABELS, ids=[label for _, label in LABELS])
def test_the_label_names_the_parts_given_in_place_of_the_presets(tmp_path, settings, label):
    args = arguments(tmp_path, **settings)
    assert args.algorithm_label == label == build_algorithm(args).describe()["name"]


def test_the_run_is_recorded_and_tabled_as_what_ran(tmp_path):
    args = arguments(tmp_path, fed_algorithm="fedavg", aggregator="fednova")
    create_trainer(TinyClassifier(), args, TRAIN, TEST, label_column="labels").train()
    run = tmp_path / "run"
    config = json.loads((run / "final_model" / "federated_config.json").read_text())
    assert config["algorithm"]["name"] == "fedavg (aggregator=fednova)"
    assert summarize_run(run).algorithm == "fedavg (aggregator=fednova)"  # hf-fedflat train / compare's table
    card = (run / "final_model" / "README.md").read_text()
    assert "**fedavg (aggregator=fednova)**" in card and "Local SGD, weighted average" not in card  # not fedavg's


def test_the_comparison_and_sweep_rows_name_what_ran(tmp_path):
    args = arguments(tmp_path, perturbation="sam")
    rows, _ = run_comparison(args, ["fedavg"], TinyClassifier, TRAIN, TEST, label_column="labels")
    assert [row["algorithm"] for row in rows] == ["fedavg (perturbation=sam)"]
    sweep = expand_members({"output_dir": str(tmp_path / "sweep"), "base": {"aggregator": "fednova"},
                            "algorithms": ["fedavg", "fednova"], "seeds": [0]})
    assert [m.algorithm for m in sweep.members] == ["fedavg-aggregatorfednova", "fednova"]
