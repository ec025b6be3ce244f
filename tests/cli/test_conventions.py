"""Comparisons whose members differ only in their methods: the conventions a comparison aligns (the reference
member's value for every member that left it to its preset), the opt-out, and the flag on a mixed table. The
expected values are written out by hand from the presets' papers, not computed by the code under test."""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest

from hf_fedflat import FedTrainingArguments, create_trainer
from hf_fedflat.algorithms.presets import CONVENTION_FIELDS
from hf_fedflat.algorithms.registry import PRESETS, TABLES
from hf_fedflat.cli.comparison import format_markdown, run_comparison, write_comparison
from hf_fedflat.cli.conventions import MemberConventions, plan_alignment
from hf_fedflat.cli.sweep import format_markdown as sweep_markdown
from hf_fedflat.cli.sweep import load_sweep_config
from hf_fedflat.field_checks import ConfigError

from conftest import TinyClassifier, make_tiny_dataset

TRAIN = make_tiny_dataset(n=48, seed=1)
TEST = make_tiny_dataset(n=12, seed=2)


def arguments(tmp_path, **settings) -> FedTrainingArguments:
    return FedTrainingArguments(output_dir=str(tmp_path / "run"), use_cpu=True, num_clients=4, clients_per_round=2,
                                num_rounds=1, local_steps=1, per_device_train_batch_size=4, disable_tqdm=True,
                                report_to="none", **settings)


class Recorder:
    """A trainer factory that records each member's arguments and trains nothing."""

    def __init__(self):
        self.args = {}

    def __call__(self, model, args, *a, **k):
        self.args[args.fed_algorithm] = args

        class Done:
            def train(self):
                return type("Output", (), {"history": [{"round": 1, "eval_accuracy": 0.5, "round_seconds": 1.0}]})()

        return Done()


def compare(tmp_path, names, **kwargs):
    recorder = Recorder()
    rows, _ = run_comparison(kwargs.pop("args", None) or arguments(tmp_path), names, TinyClassifier, TRAIN, TEST,
                             label_column="labels", trainer_factory=recorder, **kwargs)
    return rows, recorder.args


# --- the classification is data ------------------------------------------------------------------------------
def test_every_convention_is_a_field_and_method_fields_are_conventions_the_preset_sets():
    names = {f.name for f in dataclasses.fields(FedTrainingArguments)}
    assert set(CONVENTION_FIELDS) <= names
    for spec in PRESETS.values():
        assert set(spec.method_fields) <= set(CONVENTION_FIELDS) & set(spec.defaults), spec.name
    # the aggregation weights, the server's control-variate average and the decentralized participation are
    # conventions; rho and the server learning rate (FedAdam's 0.1) are methods' hyperparameters
    assert {"aggregation_weights", "scaffold_server_average", "decentralized_participation"} <= set(CONVENTION_FIELDS)
    assert not {"rho", "server_learning_rate", "gam_alpha", "prox_mu"} & set(CONVENTION_FIELDS)
    assert PRESETS["dfedavgm"].method_fields == ("optim_args",) and PRESETS["dpsgd"].method_fields == ("local_steps",)


# --- the plan, on hand-written members -----------------------------------------------------------------------
FEDAVG = MemberConventions("fedavg", {"aggregation_weights": "samples"}, frozenset({"aggregation_weights"}))
FEDGAM = MemberConventions("fedgam", {"aggregation_weights": "uniform"}, frozenset({"aggregation_weights"}))


def test_the_plan_gives_the_first_members_value_to_the_members_that_left_it_to_their_preset():
    report = plan_alignment([FEDAVG, FEDGAM])
    assert report.changes_for("fedgam") == {"aggregation_weights": "samples"} and report.changes_for("fedavg") == {}
    assert not report.mixed and report.flag("fedgam") == ""
    assert plan_alignment([FEDGAM, FEDAVG]).changes_for("fedavg") == {"aggregation_weights": "uniform"}
    # a reference named (a sweep's baseline) wins over the order
    assert plan_alignment([FEDGAM, FEDAVG], reference="fedavg").changes_for("fedgam") == {"aggregation_weights": "samples"}


def test_the_plan_keeps_a_value_given_for_one_member_and_a_methods_own_field_and_flags_the_first():
    given = MemberConventions("fedsam-uniform", {"aggregation_weights": "uniform"}, frozenset())
    report = plan_alignment([FEDAVG, given])
    assert report.aligned == [] and report.differing == {"fedsam-uniform": {"aggregation_weights": "uniform"}}
    assert report.flag("fedsam-uniform") == "† aggregation_weights=uniform"
    # DFedAvgM's momentum is its method: neither aligned nor flagged
    dfedavg = MemberConventions("dfedavg", {"optim_args": None}, frozenset())
    dfedavgm = MemberConventions("dfedavgm", {"optim_args": "momentum=0.9"}, frozenset({"optim_args"}),
                                 frozenset({"optim_args"}))
    report = plan_alignment([dfedavg, dfedavgm])
    assert report.aligned == [] and not report.mixed


def test_per_method_aligns_nothing_and_flags_every_member_that_differs():
    report = plan_alignment([FEDAVG, FEDGAM], "per_method")
    assert report.aligned == [] and report.differing == {"fedgam": {"aggregation_weights": "uniform"}}
    assert any("aggregation_weights=uniform (reference fedavg: samples)" in line for line in report.lines())
    with pytest.raises(ValueError, match="^conventions: must be 'aligned' .* got 'fair'"):
        plan_alignment([FEDAVG], "fair")


# --- the effective arguments of a comparison -------------------------------------------------------------------
def test_fedavg_and_fedgam_compared_get_the_same_aggregation_weights(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="hf_fedflat"):
        rows, args = compare(tmp_path, ["fedavg", "fedgam", "fedgam_cv"])
    assert {name: a.aggregation_weights for name, a in args.items()} == \
        {"fedavg": "samples", "fedgam": "samples", "fedgam_cv": "samples"}
    assert args["fedgam"].rho == 0.02  # the method's own hyperparameter: FedGAM's, not aligned
    assert args["fedgam_cv"].scaffold_server_average == "sampled"  # read by one member only: nothing to align with
    summary = "\n".join(r.getMessage() for r in caplog.records)
    assert "aggregation_weights = samples (fedavg's)" in summary and "fedgam uniform -> samples" in summary
    assert "--conventions per_method" in summary
    table = format_markdown(rows)
    assert "aggregation_weights = samples (fedavg's)" in table and "differs in" not in table
    assert [row["conventions"] for row in rows] == ["", "", ""]


def test_the_opt_out_reproduces_each_presets_conventions_and_flags_the_table(tmp_path):
    rows, args = compare(tmp_path, ["fedavg", "fedgam"], conventions="per_method")
    assert args["fedavg"].aggregation_weights == "samples" and args["fedgam"].aggregation_weights == "uniform"
    alone = arguments(tmp_path / "alone", fed_algorithm="fedgam")  # what fedgam runs with on its own
    assert args["fedgam"].aggregation_weights == alone.aggregation_weights
    assert [row["conventions"] for row in rows] == ["", "† aggregation_weights=uniform"]
    table = format_markdown(rows)
    assert "Not like for like" in table and "| differs in (not the method) |" in table
    assert "| fedgam | " in table and "† aggregation_weights=uniform |" in table
    paths = write_comparison(rows, {}, str(tmp_path / "out"))
    written = json.loads(open(paths["conventions"]).read())["conventions"]
    assert written["mode"] == "per_method" and written["like_for_like"] is False
    assert written["differing"] == {"fedgam": {"aggregation_weights": "uniform"}}
    with pytest.raises(ConfigError, match="^conventions: "):
        compare(tmp_path, ["fedavg"], conventions="paper")


def test_a_flag_given_for_every_member_wins(tmp_path):
    _, args = compare(tmp_path, ["fedavg", "fedgam"], args=arguments(tmp_path, aggregation_weights="uniform"))
    assert args["fedavg"].aggregation_weights == "uniform" == args["fedgam"].aggregation_weights


def test_scaffold_first_aligns_the_server_control_variate_average(tmp_path):
    rows, args = compare(tmp_path, ["scaffold", "fedgam_cv"])
    # SCAFFOLD's 1/N average and samples weights for FedGAM-CV, whose preset says 1/|S_t| (eq. 22) and uniform
    assert args["fedgam_cv"].scaffold_server_average == "all_clients"
    assert args["fedgam_cv"].aggregation_weights == "samples"
    decentralized = compare(tmp_path / "d", ["dfedavg", "dfedavgm", "dpsgd"])[1]
    assert decentralized["dfedavgm"].optim_args == "momentum=0.9" and decentralized["dpsgd"].local_steps == 1


def test_two_aligned_runs_on_digits_differ_only_in_method_fields(tmp_path):
    """A short real run of FedAvg and FedGAM on digits: the two runs' arguments differ only in the algorithm, its
    pieces' hyperparameters and the output folder."""
    from hf_fedflat.data import load_digits_dataset
    from hf_fedflat.models import create_model

    data = load_digits_dataset(image_size=8, seed=0)
    recorded = {}

    def factory(model, args, *a, **k):
        recorded[args.fed_algorithm] = args
        return create_trainer(model, args, *a, **k)

    args = FedTrainingArguments(output_dir=str(tmp_path), use_cpu=True, num_clients=4, clients_per_round=2,
                                num_rounds=2, local_steps=2, per_device_train_batch_size=8, learning_rate=0.1,
                                disable_tqdm=True, report_to="none")
    rows, histories = run_comparison(args, ["fedavg", "fedgam"],
                                     lambda: create_model("small_cnn", num_classes=10, in_chans=1, image_size=8),
                                     data["train"], data["test"], trainer_factory=factory)
    assert [len(h) for h in histories.values()] == [2, 2]
    fedavg, fedgam = (dict((f.name, getattr(recorded[n], f.name)) for f in dataclasses.fields(FedTrainingArguments)
                           if f.init) for n in ("fedavg", "fedgam"))
    differing = {name for name in fedavg if fedavg[name] != fedgam[name]}
    gam_fields = {f.name for f in dataclasses.fields(TABLES["perturbation"]["gam"].config_class)}
    assert differing - gam_fields == {"fed_algorithm", "output_dir", "logging_dir"} or \
        differing - gam_fields == {"fed_algorithm", "output_dir"}
    assert not differing & set(CONVENTION_FIELDS)
    assert fedavg["aggregation_weights"] == fedgam["aggregation_weights"] == "samples"


# --- the sweep -----------------------------------------------------------------------------------------------
def test_a_sweep_aligns_its_members_fields_and_flags_a_member_given_its_own(tmp_path):
    sweep = tmp_path / "sweep.yaml"
    base = {"dataset_name": "digits", "num_clients": 4, "clients_per_round": 2, "num_rounds": 1, "use_cpu": True}
    values = {"output_dir": str(tmp_path / "out"), "base": base, "baseline": "fedavg", "seeds": [0],
              "algorithms": ["fedgam", "fedavg", {"name": "fedsam-uniform", "fed_algorithm": "fedsam",
                                                  "aggregation_weights": "uniform"}]}
    sweep.write_text(json.dumps(values))
    config = load_sweep_config(str(sweep))
    fields = {m.group: m.fields for m in config.members}
    assert fields["fedgam"]["aggregation_weights"] == "samples"  # the baseline's, not the first entry's
    assert "aggregation_weights" not in fields["fedavg"] and fields["fedsam-uniform"]["aggregation_weights"] == "uniform"
    member = json.loads((tmp_path / "out" / "sweep" / "members" / "fedgam-seed0.json").read_text())
    assert member["aggregation_weights"] == "samples"  # what the member runs with
    report = config.convention_report
    assert report.differing == {"fedsam-uniform": {"aggregation_weights": "uniform"}}
    rows = [{"group": g, "algorithm": g, "hyperparameters": "", "partition": "base", "seeds": 0, "seeds_planned": 1,
             "reached": 0, "conventions": report.flag(g),
             **{f"{k}_{s}": float("nan") for k in ("final", "best", "rounds_to_target", "seconds_to_target",
                                                    "seconds_per_round", "mb_per_round") for s in ("mean", "std")}}
            for g in fields]
    table = sweep_markdown(rows, "eval_accuracy", None, None, report)
    assert "aggregation_weights = samples (fedavg's)" in table and "† aggregation_weights=uniform |" in table

    values["conventions"] = "per_method"
    sweep.write_text(json.dumps(values))
    config = load_sweep_config(str(sweep), output_dir=str(tmp_path / "per_method"))
    assert "aggregation_weights" not in {m.group: m.fields for m in config.members}["fedgam"]
    assert set(config.convention_report.differing) == {"fedgam", "fedsam-uniform"}
    values["conventions"] = "fair"
    sweep.write_text(json.dumps(values))
    with pytest.raises(ValueError, match="conventions: must be 'aligned'"):
        load_sweep_config(str(sweep))


# --- runs compared after the fact ----------------------------------------------------------------------------
def write_run(path, algorithm: str, training: dict, hyperparameters: dict | None = None) -> None:
    (path / "final_model").mkdir(parents=True)
    (path / "history.json").write_text(json.dumps([{"round": 1, "eval_accuracy": 0.5, "round_seconds": 1.0,
                                                    "wall_seconds": 1.0}]))
    (path / "final_model" / "federated_config.json").write_text(json.dumps(
        {"algorithm": {"name": algorithm}, "training": training, "clients_per_round": 5,
         "algorithm_hyperparameters": hyperparameters or {}}))


def test_hf_fedflat_compare_flags_runs_that_differ_in_more_than_their_method(tmp_path, capsys):
    from hf_fedflat.cli import main

    same = {"learning_rate": 0.05, "optim": "sgd", "local_steps": 10}
    write_run(tmp_path / "runs" / "a", "fedavg", {**same, "aggregation_weights": "samples"})
    write_run(tmp_path / "runs" / "b", "fedgam", {**same, "aggregation_weights": "uniform"}, {"rho": 0.02})
    write_run(tmp_path / "runs" / "c", "fedsam", {**same, "aggregation_weights": "samples"}, {"rho": 0.05})
    assert main(["compare", str(tmp_path / "runs"), "--out_dir", str(tmp_path / "cmp")]) == 0
    out = capsys.readouterr().out
    assert "b: aggregation_weights=uniform (reference a: samples)" in out
    assert "| differs in (not the method) |" in out and "| † aggregation_weights=uniform |" in out
    assert "| c | fedsam | 1 | 0.5000 | 0.5000 (1) | 1.00 | 1.0 | - |" in out  # rho is the method's: not flagged
    write_run(tmp_path / "alike" / "a", "fedavg", {**same, "aggregation_weights": "uniform"})
    write_run(tmp_path / "alike" / "b", "fedgam", {**same, "aggregation_weights": "uniform"}, {"rho": 0.02})
    assert main(["compare", str(tmp_path / "alike"), "--out_dir", str(tmp_path / "cmp2")]) == 0
    assert "differs in" not in capsys.readouterr().out
