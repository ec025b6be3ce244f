"""``concurrent_clients``: K clients of a round at once in one process give the weights of one at a time, bit for bit.

The references are independent of this run: the golden record (``tests/golden/weights_before_redesign.json``,
written before the redesign, one client at a time), a run with ``concurrent_clients=1`` in the same test, and
for the random generators the numbers a freshly seeded generator draws.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import threading

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from hf_fedflat import FedTrainingArguments, FederatedCallback, create_trainer
from hf_fedflat.runtime.lanes import Lane, RngGuard, own_gradient_state

from conftest import TinyClassifier, make_tiny_dataset
from golden.record_weights import RECORD, TEST, TRAIN, base_settings, digest, runs
from helpers import REPO_ROOT as ROOT
from helpers.random_draws import DropoutClassifier, noisy_train_data

with open(RECORD) as handle:
    RECORDED = json.load(handle)


class ClientOrder(FederatedCallback):
    def __init__(self):
        self.ended: list[tuple[int, int]] = []

    def on_client_end(self, trainer, round_index, update, **kwargs):
        self.ended.append((round_index, update.client_id))


def run(overrides: dict, model=None, train=TRAIN, inject=None):
    """``(final weights, trainer, history, client order)`` of the golden record's 3-round run with ``overrides``."""
    with tempfile.TemporaryDirectory() as tmp:
        settings = base_settings(tmp)
        settings.update(overrides)
        args = FedTrainingArguments(**settings)
        torch.manual_seed(0)
        order = ClientOrder()
        trainer = create_trainer(model if model is not None else TinyClassifier(), args, train, TEST,
                                 label_column="labels", callbacks=[order])
        if inject is not None:
            inject(trainer)
        output = trainer.train()
        return output.params.detach().to(torch.float32).contiguous(), trainer, output.history, order.ended


def lanes_used(trainer) -> list[int]:
    return [len(lane.clients) for lane in trainer.local_training.concurrent.lanes]


def every_lane_takes_a_client(monkeypatch) -> None:
    """Each lane's first client waits (the generator guard let go) until every lane has taken one, so the clients
    are spread over the lanes whatever the scheduler does: on a loaded machine one lane may otherwise take them all."""
    from hf_fedflat.federation import concurrent

    def run_lanes(lanes, guard, items, work, **kwargs):
        barrier = threading.Barrier(max(1, min(len(lanes), len(items))))
        started: set[int] = set()

        def first_client_waits(lane, item):
            if lane.index not in started:
                started.add(lane.index)
                with guard.released(lane):
                    barrier.wait(timeout=600)
            return work(lane, item)

        return original(lanes, guard, items, first_client_waits, **kwargs)

    original = concurrent.run_lanes
    monkeypatch.setattr(concurrent, "run_lanes", run_lanes)


# -- every kind of algorithm: the golden record, written one client at a time -----------------------------------
@pytest.mark.parametrize("name", ["fedavg", "scaffold", "fedlesam", "fedsam", "dfedgam", "scaffold_accumulation"])
def test_concurrent_clients_reproduce_the_recorded_weights(name, monkeypatch):
    every_lane_takes_a_client(monkeypatch)
    params, trainer, history, _ = run({**runs()[name], "concurrent_clients": 3})
    assert digest(params) == RECORDED[name]["sha256"], (name, float(params.double().norm()), RECORDED[name]["norm"])
    used = lanes_used(trainer)
    assert len(used) == 3 and sum(used) == sum(r["num_clients"] for r in history)
    assert all(n > 0 for n in used)  # the clients really were spread over the lanes


def test_lanes_have_their_own_models_trainers_and_arguments():
    _, trainer, _, _ = run({"fed_algorithm": "fedavg", "concurrent_clients": 2, "num_rounds": 1})
    main, other = trainer.local_training.concurrent.lanes
    assert main.trainer is trainer.client_trainer and other.trainer is not main.trainer
    assert other.trainer.args is not main.trainer.args
    pointers = {p.data_ptr() for p in main.trainer.model.parameters()}
    assert not pointers & {p.data_ptr() for p in other.trainer.model.parameters()}
    assert other.trainer.space.numel == main.trainer.space.numel
    assert other.trainer.accelerator.gradient_state is not main.trainer.accelerator.gradient_state


# -- random numbers: dropout in the step, a random transform in the batch fetch, the data order ----------------
def test_dropout_and_random_transforms_give_the_same_weights_as_one_client_at_a_time(monkeypatch):
    every_lane_takes_a_client(monkeypatch)
    settings = {"fed_algorithm": "fedsam", "remove_unused_columns": False}
    torch.manual_seed(0)
    one, *_ = run(settings, model=DropoutClassifier(), train=noisy_train_data())
    torch.manual_seed(0)
    many, trainer, _, _ = run({**settings, "concurrent_clients": 3}, model=DropoutClassifier(),
                              train=noisy_train_data())
    assert torch.equal(one, many)
    assert all(n > 0 for n in lanes_used(trainer))
    # the draws matter: the same run with another seed ends elsewhere (so a mixed-up generator would show)
    other, *_ = run({**settings, "seed": 8}, model=DropoutClassifier(), train=noisy_train_data())
    assert not torch.equal(one, other)


def test_rng_guard_gives_each_lane_the_numbers_of_its_own_seed():
    def draws():
        return torch.rand(3).tolist(), float(np.random.rand()), random.random()

    def alone(seed):
        torch.manual_seed(seed), np.random.seed(seed), random.seed(seed)
        return [draws() for _ in range(3)]

    guard, a, b = RngGuard("cpu"), Lane(0, None), Lane(1, None)
    seen = {0: [], 1: []}
    for step in range(3):  # a and b take turns on the one set of generators
        for lane, seed in ((a, 11), (b, 12)):
            with guard.hold(lane):
                if step == 0:
                    torch.manual_seed(seed), np.random.seed(seed), random.seed(seed)
                with guard.hold(lane):  # held already: nothing swapped
                    seen[lane.index].append(draws())
                with guard.released(lane):
                    assert not lane.holding
                assert lane.holding
    assert seen[0] == alone(11) and seen[1] == alone(12)
    assert guard.swaps == 6


def test_each_lane_has_its_own_gradient_state():
    from accelerate.state import GradientState

    shared = GradientState()
    first, second = own_gradient_state(), own_gradient_state()
    first.sync_gradients = False  # a lane in the middle of an accumulation step
    assert second.sync_gradients is True and shared.sync_gradients is True
    first.plugin_kwargs["num_steps"] = 5
    assert second.num_steps == shared.num_steps != 5


# -- failures ---------------------------------------------------------------------------------------------------
def raise_at(client_ids):
    def inject(trainer):
        original = trainer.train_client

        def faulty(client_id, *args, **kwargs):
            if client_id in client_ids:
                raise RuntimeError(f"disk on fire at client {client_id}")
            return original(client_id, *args, **kwargs)

        trainer.train_client = faulty

    return inject


def test_a_client_raising_in_a_lane_is_excluded_and_recorded_as_one_at_a_time():
    settings = {"fed_algorithm": "scaffold", "clients_per_round": 4}
    one, _, history_one, order_one = run(settings, inject=raise_at({1, 4}))
    many, trainer, history_many, order_many = run({**settings, "concurrent_clients": 3}, inject=raise_at({1, 4}))
    assert torch.equal(one, many)
    failed = [r.get("failed_clients", []) for r in history_many]
    assert failed == [r.get("failed_clients", []) for r in history_one]
    assert {"client": 1, "reason": "training raised RuntimeError: disk on fire at client 1"} in sum(failed, [])
    assert [r["clients"] for r in history_many] == [r["clients"] for r in history_one]
    assert order_many == order_one  # on_client_end in the share's order


def test_concurrent_clients_is_validated():
    with tempfile.TemporaryDirectory() as tmp:
        for bad in (0, -1, 1.5, True):
            with pytest.raises(ValueError, match=r"^concurrent_clients: must be an integer >= 1"):
                FedTrainingArguments(**{**base_settings(tmp), "concurrent_clients": bad})


# -- two processes x 2 clients at once == one process x one at a time ------------------------------------------
FLAGS = {"fed_algorithm": "fedlesam_s+fedgh", "num_clients": 6, "clients_per_round": 5, "num_rounds": 2,
         "local_steps": 2, "per_device_train_batch_size": 4, "partition_scheme": "iid", "learning_rate": 0.1}
SCRIPT = ROOT / "tests" / "scripts" / "tiny_federated_run.py"


@pytest.mark.timeout(600)
def test_two_processes_with_two_clients_each_equal_one_process(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    flags = [item for name, value in FLAGS.items() for item in (f"--{name}", str(value))]
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
               str(ROOT / "accelerate_configs" / "cpu_2proc.yaml"), "--main_process_port", "0", str(SCRIPT),
               "--output_dir", str(tmp_path / "two"), *flags, "--disable_tqdm", "true", "--concurrent_clients", "2"]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    two = load_file(str(tmp_path / "two" / "final_params.safetensors"))["params"]
    # the script's run, here in one process, one client at a time
    args = FedTrainingArguments(output_dir=str(tmp_path / "one"), use_cpu=True, disable_tqdm=True, **FLAGS)
    torch.manual_seed(args.seed)
    model = TinyClassifier()
    output = create_trainer(model, args, make_tiny_dataset(n=96, seed=1), make_tiny_dataset(n=30, seed=2),
                            label_column="labels").train()
    assert torch.equal(output.params, two)
    history = json.loads((tmp_path / "two" / "history.json").read_text())
    assert [r["clients"] for r in history] == [r["clients"] for r in output.history]


# -- the generator guard under load: no lane draws from, or reads, another lane's generator states ---------------
def test_the_row_loader_reads_torchs_seed_when_iterated_not_when_built():
    """A lane builds its client's row loader outside the generator guard, where another lane's states may be
    swapped in; the shuffle must follow the seed in force when the batches are fetched (under the guard)."""
    from hf_fedflat.runtime import client_loop

    original = client_loop.tensor_rows_loader

    def built_while_another_lane_holds_the_generators(trainer, args):
        state = torch.get_rng_state()
        torch.manual_seed(12345)  # what another lane's swapped-in states look like to this thread
        try:
            return original(trainer, args)
        finally:
            torch.set_rng_state(state)

    client_loop.tensor_rows_loader = built_while_another_lane_holds_the_generators
    try:
        params, trainer, _, _ = run({**runs()["fedavg"]})
    finally:
        client_loop.tensor_rows_loader = original
    assert trainer.client_trainer.lean_loop_clients > 0  # the row loader really was used
    assert digest(params) == RECORDED["fedavg"]["sha256"]


@pytest.mark.parametrize("name", ["scaffold", "fedlesam"])
def test_lanes_beside_a_busy_thread_reproduce_the_recorded_weights(name, monkeypatch):
    """Lanes next to a thread that keeps the interpreter and a core busy (it draws no random numbers): the thread
    switches land at other points every run, the weights must not move."""
    stop = threading.Event()

    def busy():
        ones = torch.ones(64, 64)
        while not stop.is_set():
            ones @ ones

    every_lane_takes_a_client(monkeypatch)
    hogs = [threading.Thread(target=busy, daemon=True) for _ in range(2)]
    for hog in hogs:
        hog.start()
    try:
        for _ in range(3):
            params, trainer, _, _ = run({**runs()[name], "concurrent_clients": 3})
            assert digest(params) == RECORDED[name]["sha256"], (name, float(params.double().norm()))
            assert all(n > 0 for n in lanes_used(trainer))
    finally:
        stop.set()
        for hog in hogs:
            hog.join()
