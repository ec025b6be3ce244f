"""Workload 6: data as users store it (CPU).

    python benchmarks/user_data.py [--rounds 100] [--repeats 2] [--formats torch,numpy] [--output benchmarks/user_data.json]
    python benchmarks/user_data.py --profile      # cProfile of one FedAvg run per format, no lock-step

The FedAvg job of a plain PyTorch loop: scikit-learn digits (8x8, the whole 1,797 images), 100 Dirichlet
(0.3) clients, 10 per round, a 4.9k-parameter CNN (``small_cnn`` with 8/16 channels, 3x3 kernels, 48
hidden units), batch 16, SGD lr 0.05, clipping at 10, one local epoch. The data are handed to
``FederatedTrainer`` as users hold them: ``datasets.Dataset.from_dict({"pixel_values": nested lists,
"labels": ints})`` with ``set_format("torch")`` (or ``"numpy"``). The plain loop indexes two tensors.

Sides, in lock-step (``benchmarks/run.py``'s :class:`LockStep`, round ``t`` of every side within the same
second or two; each round keeps its fastest time over the repeats):

* ``plain_loop``: ``x[idx]``, ``y[idx]`` per batch, the same shuffles (``RandomSampler`` seeded with
  ``derive_seed(seed, round, client)``), the same clipping and aggregation;
* ``fedavg_<format>``: ``FederatedTrainer`` on the ``Dataset`` (fast path on: the client data are
  materialised once as tensors, ``hf_fedflat.runtime.materialize``);
* ``fedavg_<format>_unmaterialised``: the same with the ``materialize`` mechanism off (datasets formats
  every row; measured at 3.3x before rows were materialised);
* ``fedavg_<format>_without_<mechanism>`` (``--without``, default ``client_loop``): the first format with one more
  fast-path mechanism off, what that mechanism saves on this workload.

Ratios: seconds per timed round / the plain loop's (target <= 1.10 for the fast path). The final weights of
every side are compared with the plain loop's (``max_abs_weight_diff``; identical computations give 0).

Python calls per round (``python_calls_per_round``, ``--count-rounds``, 0 to skip): every Python and C function call a
side makes in its rounds 1..N, counted by ``sys.setprofile`` in a separate untimed run. Unlike the times, the counts do
not move with the VM's load: the same code gives the same count, so they show what a change removed where a
timing cannot resolve it (a client here is ~2 steps of ~1 ms, and each extra call costs ~0.5-1 us inside the loop).
Tensor operations per round (``tensor_ops_per_round``): the operations torch's dispatcher runs for a side in the same
rounds (a ``TorchDispatchMode``, another untimed run). Between training steps an operation costs ~10-25 us here
against ~5 us in a warm loop (measured 2026-11-25: torch's clipping, 8 operations plus its grouping, took ~240 us a step inside
the client loop and ~120 us alone), so these count as much as the calls.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import cProfile  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as bench  # noqa: E402  (lock-step helpers: LockStep, RunTiming, RoundClock, ratio_record, ...)
from run import BeforeRound, RoundClock, RoundGate, RunTiming, load_average, log, no_gate  # noqa: E402
from workloads import Job, Workload  # noqa: E402
from workloads import run_plain as run_plain_loop  # noqa: E402

import datasets  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from transformers import set_seed  # noqa: E402

from hf_fedflat import FederatedTrainer  # noqa: E402
from hf_fedflat.data import partition_dataset  # noqa: E402
from hf_fedflat.models import create_model  # noqa: E402
from hf_fedflat.runtime import fast_path  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Setting:
    num_rounds: int = 100
    num_clients: int = 100
    clients_per_round: int = 10
    batch_size: int = 16
    learning_rate: float = 0.05
    max_grad_norm: float = 10.0
    dirichlet_alpha: float = 0.3
    min_partition_size: int = 2
    seed: int = 42


MODEL_KWARGS = dict(conv_channels=(8, 16), hidden_dim=48, kernel_size=3)


@dataclasses.dataclass
class Data:
    x: torch.Tensor  # (N, 1, 8, 8) float32
    y: torch.Tensor  # (N,) int64
    raw: dict  # the columns as users hold them (nested lists, ints)
    partition: object


def load(setting: Setting) -> Data:
    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None]  # exact in float32
    y = digits.target.astype(np.int64)
    raw = {"pixel_values": x.tolist(), "labels": y.tolist()}
    labelled = datasets.Dataset.from_dict({"label": y.tolist()})
    partition = partition_dataset(labelled, setting.num_clients, "dirichlet", alpha=setting.dirichlet_alpha,
                                  min_partition_size=setting.min_partition_size, seed=setting.seed)
    return Data(torch.from_numpy(x), torch.from_numpy(y), raw, partition)


def user_dataset(data: Data, fmt: str) -> datasets.Dataset:
    dataset = datasets.Dataset.from_dict(data.raw)
    dataset.set_format(fmt)
    return dataset


def fresh_model(setting: Setting) -> torch.nn.Module:
    set_seed(setting.seed)
    return create_model("small_cnn", num_classes=10, in_chans=1, image_size=8, **MODEL_KWARGS)


def run_plain(setting: Setting, data: Data, before_round: RoundGate = no_gate) -> RunTiming:
    """FedAvg as a plain loop over two tensors (the same steps as ``FederatedTrainer``): ``workloads.run_plain``,
    one local epoch per client, batches indexed straight from ``data.x`` / ``data.y``."""
    job = Job(num_rounds=setting.num_rounds, num_clients=setting.num_clients,
              clients_per_round=setting.clients_per_round, batch_size=setting.batch_size,
              learning_rate=setting.learning_rate, local_steps=None, max_grad_norm=setting.max_grad_norm,
              seed=setting.seed)
    workload = Workload("user_data", job, lambda: fresh_model(setting), None, data.partition,
                        fetch=lambda rows: {"pixel_values": data.x[rows], "labels": data.y[rows]})
    return run_plain_loop(workload, before_round)


def run_trainer(setting: Setting, data: Data, fmt: str, materialize: bool, before_round: RoundGate = no_gate,
                profile: bool = False, without: tuple[str, ...] = ()) -> RunTiming:
    label = f"fedavg_{fmt}" + ("" if materialize else "_unmaterialised") + "".join(f"_without_{m}" for m in without)
    timing = RunTiming(label)
    dataset = user_dataset(data, fmt)  # a fresh Dataset per run: nothing cached from an earlier run
    with fast_path(True, without=(() if materialize else ("materialize",)) + tuple(without)):
        with tempfile.TemporaryDirectory(prefix="hf_fedflat_bench_") as output_dir:
            args = bench.federated_arguments(
                bench.Setting(num_rounds=setting.num_rounds), "fedavg", output_dir,
                num_clients=setting.num_clients, clients_per_round=setting.clients_per_round,
                per_device_train_batch_size=setting.batch_size, learning_rate=setting.learning_rate,
                max_grad_norm=setting.max_grad_norm, dirichlet_alpha=setting.dirichlet_alpha,
                min_partition_size=setting.min_partition_size, seed=setting.seed)
            trainer = FederatedTrainer(fresh_model(setting), args, dataset, None, partition=data.partition,
                                       label_column="labels",
                                       callbacks=[BeforeRound(before_round), RoundClock(timing)])
            profiler = cProfile.Profile() if profile else None
            if profiler:
                profiler.enable()
            output = trainer.train()
            if profiler:
                profiler.disable()
                print(bench.profile_report(profiler, 30))
    timing.final_params = output.params
    return timing


def count_python_calls(run_side, rounds: int) -> float:
    """Python and C function calls per round of ``run_side(gate)`` over its rounds 1..``rounds`` (round 0 warms up)."""
    calls = [0]

    def count(frame, event, arg):
        if event == "call" or event == "c_call":
            calls[0] += 1

    def gate(round_index: int) -> None:
        if round_index == 1:
            sys.setprofile(count)
        elif round_index == rounds + 1:
            sys.setprofile(None)

    try:
        run_side(gate)
    finally:
        sys.setprofile(None)
    return calls[0] / rounds


class _TensorOpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def count_tensor_ops(run_side, rounds: int) -> float:
    """Operations torch's dispatcher runs per round in ``run_side(gate)``'s rounds 1..``rounds`` (as
    :func:`count_python_calls`)."""
    counter = _TensorOpCounter()
    entered = [False]

    def gate(round_index: int) -> None:
        if round_index == 1:
            counter.__enter__()
            entered[0] = True
        elif round_index == rounds + 1 and entered[0]:
            counter.__exit__(None, None, None)
            entered[0] = False

    try:
        run_side(gate)
    finally:
        if entered[0]:
            counter.__exit__(None, None, None)
    return counter.count / rounds


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--formats", default="torch,numpy")
    parser.add_argument("--no-unmaterialised", action="store_true", help="Leave out the sides without materialising.")
    parser.add_argument("--without", default="client_loop",
                        help="Comma-separated fast-path mechanisms: a side per mechanism with it off (materialised, "
                             "first format only; '' for none).")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--count-rounds", type=int, default=10,
                        help="Rounds whose Python calls are counted per side (an untimed run; 0: no count).")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    setting = Setting(num_rounds=args.rounds)
    data = load(setting)
    formats = [f for f in args.formats.split(",") if f]
    if args.profile:
        for fmt in formats:
            for materialize in (True, False):
                t0 = time.perf_counter()
                run_trainer(setting, data, fmt, materialize, profile=True)
                log(f"profile {fmt} materialize={materialize}: {time.perf_counter() - t0:.2f} s")
        return []
    short = dataclasses.replace(setting, num_rounds=3)
    run_plain(short, data)  # warm-up: one-time costs of the process
    for fmt in formats:
        run_trainer(short, data, fmt, True)
    runners = {"plain_loop": lambda gate: run_plain(setting, data, gate)}
    for fmt in formats:
        runners[f"fedavg_{fmt}"] = lambda gate, fmt=fmt: run_trainer(setting, data, fmt, True, gate)
        if not args.no_unmaterialised:
            runners[f"fedavg_{fmt}_unmaterialised"] = lambda gate, fmt=fmt: run_trainer(setting, data, fmt, False, gate)
    for mechanism in [m for m in args.without.split(",") if m]:
        runners[f"fedavg_{formats[0]}_without_{mechanism}"] = lambda gate, m=mechanism: run_trainer(
            setting, data, formats[0], True, gate, without=(m,))
    calls, ops = {}, {}
    if args.count_rounds > 0:
        counted = dataclasses.replace(setting, num_rounds=args.count_rounds + 2)
        calls["plain_loop"] = count_python_calls(lambda gate: run_plain(counted, data, gate), args.count_rounds)
        for fmt in formats:
            calls[f"fedavg_{fmt}"] = count_python_calls(
                lambda gate, fmt=fmt: run_trainer(counted, data, fmt, True, gate), args.count_rounds)
        log("Python calls per round: " + ", ".join(f"{k} {v:.0f}" for k, v in calls.items()))
        ops["plain_loop"] = count_tensor_ops(lambda gate: run_plain(counted, data, gate), args.count_rounds)
        for fmt in formats:
            ops[f"fedavg_{fmt}"] = count_tensor_ops(
                lambda gate, fmt=fmt: run_trainer(counted, data, fmt, True, gate), args.count_rounds)
        log("Tensor operations per round: " + ", ".join(f"{k} {v:.1f}" for k, v in ops.items()))
    load_before = load_average()
    best = bench.lock_step_repeats(runners, args.repeats, "user data")
    runs = best.pop("_runs")
    env = {"load_avg_before": load_before, "load_avg_after": load_average(), "torch_threads": torch.get_num_threads(),
           "setting": dataclasses.asdict(setting), "model_parameters": sum(p.numel() for p in fresh_model(setting).parameters()),
           "python_calls_per_round": {k: round(v, 1) for k, v in calls.items()},
           "tensor_ops_per_round": {k: round(v, 1) for k, v in ops.items()}}
    records = []
    for name, timing in best.items():
        if name == "plain_loop":
            continue
        target = 1.10 if "unmaterialised" not in name and "_without_" not in name else float("inf")
        records.append(bench.ratio_record(f"user_data_{name}_vs_plain_loop", target, False, f"{name} / plain loop",
                                          timing, best["plain_loop"], runs, same_math=True, extra=env))
    for record in records:
        d = record["details"]
        print(f"{record['name']}: {record['ratio']:.3f} (target <= {record['target']}) {d['raw']} ms/round; "
              f"max |dw| {d['max_abs_weight_diff']:.2e}; load {d['load_avg_before']} -> {d['load_avg_after']}")
    if args.output:
        Path(args.output).write_text(json.dumps(records, indent=1) + "\n")
    return records


if __name__ == "__main__":
    main()
