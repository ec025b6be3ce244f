"""Real deployments: a ``flower-superlink`` and ``flower-supernode`` processes on 127.0.0.1 (free ports), the App
written by ``hf-fedflat flower-app`` run with ``flwr run``; every process stopped at the end, also on failure."""

from __future__ import annotations

import json
import os
import re
import time

import pytest

from helpers.flower import final_weights, max_difference, run_in_process, train_builtin, write_config

pytest.importorskip("flwr")
pytestmark = pytest.mark.slow

from hf_fedflat.flower.local import LocalFederation, _command_line  # noqa: E402

RUN_TIMEOUT = 300  # seconds for one flwr run of a few rounds (a run takes 20-60 s on a loaded 2-core VM)


def write_app(folder, **changes) -> str:
    """``hf-fedflat flower-app`` of the settings (in this process)."""
    from hf_fedflat.cli.commands import flower_app_main

    app = os.path.join(folder, "app")
    assert flower_app_main(["--config", write_config(folder, **changes), "--output", app]) == 0
    return app


def history(output_dir) -> list[dict]:
    with open(os.path.join(output_dir, "history.json")) as f:
        return json.load(f)


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def rounds_recorded(output_dir) -> int:
    try:
        return len(history(output_dir))
    except (OSError, ValueError):
        return 0


@pytest.fixture(scope="module", autouse=True)
def one_thread_everywhere():
    """One torch thread in this process (the built-in runs) and in every process of the federations (their env is
    this one's): a CPU kernel's float reductions depend on its thread count, so equal counts are part of "the same
    machine" that bit-identity needs."""
    import torch

    threads, variable = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"
    yield
    torch.set_num_threads(threads)
    if variable is None:
        del os.environ["OMP_NUM_THREADS"]
    else:
        os.environ["OMP_NUM_THREADS"] = variable


@pytest.fixture(scope="module")
def federation(one_thread_everywhere, tmp_path_factory):
    """Three SuperNodes (partition-id 0, 1, 2) shared by the equality runs."""
    lines = []
    with LocalFederation(3, folder=tmp_path_factory.mktemp("federation"), output=lines.append) as running:
        running.lines = lines
        yield running
        processes = running
    _assert_all_stopped(processes)


def diagnosis(federation, lines) -> str:
    """What to read when a deployment test fails: the runs' last lines, the nodes' logs and their workers' logs."""
    parts = ["".join(lines[-60:])]
    for partition_id in range(federation.num_supernodes):
        parts.append(f"--- supernode-{partition_id}.log\n" + federation.log(f"supernode-{partition_id}")[-3000:])
    parts.append("--- processes\n" + "\n".join(f"{pid} {_command_line(pid)}" for pid in federation.processes()))
    for log in sorted(federation.tmp.glob("*.log")):
        parts.append(f"--- {log.name}\n" + log.read_text(errors="replace")[-3000:])
    return "\n".join(parts)


def _assert_all_stopped(federation):
    wait_for(lambda: not federation.processes(), 15, "every process of the federation to end")
    assert not federation.tmp.exists()  # (the nodes' temporary files, the workers' sockets and logs)


EQUALITY_RUNS = [(algorithm, clients_per_round) for algorithm in
                 ("fedavg", "scaffold", "fedlesam_d", "fedgam_cv", "fedavg+fedgh", "fedgloss") for clients_per_round in (3, 2)]


@pytest.mark.timeout(1800)
def test_deployments_give_the_builtin_model(federation, tmp_path):
    """Each preset, with every client each round and with 2 of 3 sampled, deployed on the three SuperNodes (three
    runs at a time): the final weights are those of hf-fedflat train, bit for bit, and so are the sampled clients."""
    from concurrent.futures import ThreadPoolExecutor

    cases = {}
    for algorithm, clients_per_round in EQUALITY_RUNS:
        folder = tmp_path / f"{algorithm.replace('+', '_')}_{clients_per_round}"
        changes = {"fed_algorithm": algorithm, "clients_per_round": clients_per_round}
        output = str(folder / "deployed")
        cases[algorithm, clients_per_round] = folder, changes, output, write_app(folder, output_dir=output, **changes)
    with ThreadPoolExecutor(3) as pool:  # (the threads only wait on flwr run's processes)
        statuses = list(pool.map(lambda case: federation.run(case[3], timeout=RUN_TIMEOUT), cases.values()))
    for case, status in zip(cases, statuses):
        assert status == 0, f"{case}: flwr run exited {status}\n" + diagnosis(federation, federation.lines)
    # one warm worker per node, started by the node's first message, served every run (its socket in the
    # federation's own temporary folder, where stop finds it)
    for partition_id in range(3):
        node_log = federation.log(f"supernode-{partition_id}")
        starts = re.findall(r"started the node's worker \(pid \d+\) on (\S+)", node_log)
        assert len(starts) == 1 and starts[0].startswith(str(federation.tmp)), diagnosis(federation, federation.lines)
    for case, (folder, changes, output, _) in cases.items():
        builtin = train_builtin(folder / "builtin_run", **changes)
        assert max_difference(final_weights(builtin), final_weights(output)) == 0.0, case
        records = history(output)
        assert [r["clients"] for r in records] == [r["clients"] for r in history(builtin)], case
        with open(os.path.join(output, "run_status.json")) as f:
            assert json.load(f)["status"] == "completed"
        assert os.path.isfile(os.path.join(output, "final_model", "README.md"))  # the model card
        assert not os.path.exists(os.path.join(output, "client_states"))  # the states stayed on the nodes
        assert all(set(r["node_bytes"]) == {str(c) for c in r["clients"]} for r in records)


@pytest.mark.timeout(1200)
def test_killed_node_is_left_out_and_rejoins_with_its_state(tmp_path):
    """SCAFFOLD (a client state c_i on each node), 5 rounds: node 2 is SIGKILLed as soon as round 1 is recorded
    (before it can answer round 2) and restarted with the same state-dir once round 2 is recorded. Round 2 aggregates
    clients 0 and 1 and records why client 2 is missing; the node rejoins (at round 3, or at round 4 when it is not
    connected again when round 3 starts: that round says so too) from the c_2 it kept, and the run ends with the model
    computed in process for the same rounds with the same replies missing."""
    output = str(tmp_path / "deployed")
    changes = {"fed_algorithm": "scaffold", "num_rounds": 5}
    # (the first round's replies wait for each node's worker to start: minutes on a loaded 2-core machine)
    app = write_app(tmp_path, output_dir=output, flower_reply_timeout=240.0, **changes)
    lines = []
    with LocalFederation(3, folder=tmp_path / "federation", state_dirs=True, output=lines.append) as federation:
        run = federation.submit(app)
        wait_for(lambda: rounds_recorded(output) >= 1 or run.poll() is not None, RUN_TIMEOUT, "round 1")
        federation.kill_node(2)
        wait_for(lambda: rounds_recorded(output) >= 2 or run.poll() is not None, RUN_TIMEOUT, "round 2")
        federation.start_node(2)
        assert federation.follow(run, timeout=RUN_TIMEOUT * 2) == 0, diagnosis(federation, lines)
    _assert_all_stopped(federation)
    records = history(output)
    assert records[0]["clients"] == [0, 1, 2] and records[1]["clients"] == [0, 1]
    (failed,) = records[1]["failed_clients"]
    # Flower's SuperLink answers for a node that stopped sending heartbeats (2 x 30 s), or drops the message of a node
    # that left, or the wait ends first
    assert failed["client"] == 2 and any(reason in failed["reason"] for reason in (
        "Node Unavailable", "no reply from its SuperNode", "no SuperNode with partition-id=2")), failed["reason"]
    rejoined = [r["round"] for r in records[2:] if 2 in r["clients"]]
    assert rejoined and rejoined == list(range(rejoined[0], 6)), [r["clients"] for r in records]
    missing = {(r["round"] - 1, f["client"]) for r in records for f in r.get("failed_clients", [])}
    assert {client for _, client in missing} == {2}
    # node 2 kept c_2 of round 1 through its restart, and trained from it when it rejoined
    expected, _ = run_in_process(tmp_path / "in_process", {"absent": lambda round_index, client: (round_index, client)
                                                           in missing}, **changes)
    assert max_difference(final_weights(expected), final_weights(output)) == 0.0


@pytest.mark.timeout(900)
def test_server_restart_resumes_from_the_last_checkpoint(tmp_path):
    """The ServerApp's process is SIGKILLed after round 2's checkpoint; `flwr run` again with
    resume_from_checkpoint='latest' continues from it, the nodes' states (state-dir) included: the final model is the
    uninterrupted run's."""
    changes = {"fed_algorithm": "scaffold", "num_rounds": 4}
    builtin = train_builtin(tmp_path / "builtin_run", **changes)
    output = str(tmp_path / "deployed")
    app = write_app(tmp_path, output_dir=output, **changes)
    lines = []
    with LocalFederation(3, folder=tmp_path / "federation", state_dirs=True, output=lines.append) as federation:
        run = federation.submit(app)
        checkpoint = os.path.join(output, "checkpoints", "round-2")
        wait_for(lambda: os.path.isdir(checkpoint) or run.poll() is not None, RUN_TIMEOUT, "round 2's checkpoint")
        for pid in federation.server_app_processes():
            os.kill(pid, 9)
        federation.follow(run, timeout=60)
        assert rounds_recorded(output) < 4
        assert federation.run(app, {"resume_from_checkpoint": "latest"}, timeout=RUN_TIMEOUT) == 0, \
            diagnosis(federation, lines)
    _assert_all_stopped(federation)
    assert max_difference(final_weights(builtin), final_weights(output)) == 0.0
    assert [r["round"] for r in history(output)] == [1, 2, 3, 4]


def test_node_that_cannot_load_its_data_fails_in_one_line(tmp_path):
    """Node 1's data-path does not exist: the node says so in one line naming itself and the field, its client is
    left out of every round with that reason, the others train."""
    output = str(tmp_path / "deployed")
    app = write_app(tmp_path, output_dir=output)
    missing = str(tmp_path / "no_such_folder")
    lines = []
    with LocalFederation(3, folder=tmp_path / "federation", output=lines.append,
                         node_config=lambda i: {"data-path": missing} if i == 1 else {}) as federation:
        assert federation.run(app, timeout=RUN_TIMEOUT) == 0, diagnosis(federation, lines)
        node_log = federation.log("supernode-1")
    expected = f"node 1: node-config data-path: {missing} does not exist."
    for record in history(output):
        assert record["clients"] == [0, 2]
        assert record["failed_clients"] == [{"client": 1, "reason": expected}]
    assert expected in node_log
