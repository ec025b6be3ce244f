"""Whole runs, evaluation included: what a user's job costs against a plain PyTorch loop doing the same work.

    python benchmarks/whole_run.py [--only digits,transform,gossip,quickstart,text] [--rounds N] [--repeats 2]
                                   [--device cpu|cuda] [--output benchmarks/whole_run.json]
    python benchmarks/whole_run.py --smoke        # tiny sizes, seconds: a check that every section runs
    python benchmarks/whole_run.py --profile      # cProfile of one evaluated round of row (a), both sides

Local training alone runs at a plain loop's speed (``benchmarks/user_data.py``, ``benchmarks/workloads.py``); a
whole run also evaluates, averages, gossips and writes its history. Each row here puts ``FederatedTrainer`` (or the
decentralized trainer) beside a plain loop in the same process that trains the same steps (same clients, shuffles,
clipping, aggregation: ``workloads.client_order``, the final weights compared), averages or gossips the same way
and **evaluates the same rows with the same batch size every round, inside the timed round** (the library with
``eval_every_n_rounds=1`` and ``per_device_eval_batch_size`` 128, its default; the plain loop in ``torch.no_grad``
batches, loss and top-1 accuracy; the accuracies of every round are compared). The sides run in lock-step
(``benchmarks/run.py``'s :class:`LockStep`), each round keeps its fastest time over the repeats, round 0 is a
warm-up; the ratio is seconds per timed round. One process, ``--threads`` torch threads (default 1).

Sections:

* ``digits`` (a): workload 6's FedAvg job (``benchmarks/user_data.py``: scikit-learn digits 8x8, the 4.9k-parameter
  CNN, Dirichlet(0.3) over 100 clients, 10 per round, batch 16, one local epoch, 100 rounds), the data a
  ``datasets.Dataset`` in torch format, the global model evaluated on all 1,797 rows every round; target <= 1.15.
  Also the same job without evaluation (the reference, target <= 1.10 as workload 6).
* ``transform`` (b): the same job on a ``Dataset`` of raw rows (64 pixel counts 0-16 per image) with an on-the-fly
  ``with_transform`` that builds the image tensors; the plain loop reads every batch from the same transformed
  ``Dataset`` (``dataset[rows]``, the transform applied per batch), as a user's own loop would; target <= 1.25.
  Also the same transform declared deterministic (``transform.deterministic = True``), which lets the library keep
  its evaluation batches.
* ``gossip`` (c): decentralized FedAvg (``dfedavg``): 10 Dirichlet(0.3) clients on a ring, every client trains
  every round (5 local steps, batch 16), gossip ``x_i <- sum_j W_ij z_j``, then the average model and every
  client's own model evaluated on all 1,797 rows (11 evaluations a round: no thinning); 30 rounds. The plain
  gossip loop keeps the ten models as flat vectors; target <= 1.25.
* ``quickstart`` (d): ``recipes/quickstart.py`` end to end in a child process (the python equivalent of
  ``accelerate launch recipes/quickstart.py``; FedAvg, FedSAM, SCAFFOLD, 30 rounds each): wall time from launch to
  exit, and the share of it spent outside local training. The child wraps ``FederatedTrainer.call_callbacks``
  (the hook every callback goes through) to add up each client's ``train_seconds`` (from loading ``w^t`` to its
  update, as the library measures it) and to time the rounds; the recipe itself is unchanged. No target.
* ``text`` (e): ``benchmarks/text_models.py``'s BERT task (tiny BERT, ``hf-fedflat train``'s path, AdamW, 5
  clients per round, 5 local steps) with evaluation every round on both sides, FedAvg / plain loop; target <= 1.10.

``--profile``: row (a)'s library run and plain loop, each for ``--rounds`` rounds (default 12), with one evaluated
round (round 5, after the warm-up rounds) under cProfile: the call count of that round on both sides, and the
library's top 15 functions by cumulative time (``--profile-sort tottime`` for time inside each function). Nothing is
written.

``--smoke``: a few rounds and small clients in every section (and the quickstart's ``--smoke``): a check that the
script works, not a measurement (it writes ``--output`` only when given). ``--device cuda`` puts both sides of
``digits`` and ``transform`` on the GPU (``benchmarks/gpu_check.py`` runs ``digits`` there).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import run as bench  # noqa: E402
from run import BeforeRound, RoundClock, RoundGate, RunTiming, load_average, load_flat, log, no_gate  # noqa: E402
from workloads import Job, Workload, client_order, federated_args  # noqa: E402
from workloads import run_plain as run_plain_fedavg  # noqa: E402

import datasets  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from transformers import set_seed  # noqa: E402

from hf_fedflat import FedTrainingArguments  # noqa: E402
from hf_fedflat.data import partition_dataset  # noqa: E402
from hf_fedflat.models import create_model  # noqa: E402

#: the library's default ``per_device_eval_batch_size``; the plain loops evaluate in batches of the same size
EVAL_BATCH_SIZE = 128
MODEL_KWARGS = dict(conv_channels=(8, 16), hidden_dim=48, kernel_size=3)  # workload 6's 4.9k-parameter CNN
TARGETS = {"digits_eval": 1.15, "digits_no_eval": 1.10, "transform_eval": 1.25, "transform_deterministic_eval": 1.25,
           "gossip_eval": 1.25, "text_bert_eval": 1.10}


# ------------------------------------------------------------------------------------------------
# The digits: arrays, a torch-format Dataset, a raw Dataset with an on-the-fly transform
# ------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Digits:
    x: torch.Tensor  # (1797, 1, 8, 8) float32 in [0, 1]
    y: torch.Tensor  # (1797,) int64
    counts: np.ndarray  # (1797, 64) int64: the raw pixel counts 0-16


def load_digit_arrays() -> Digits:
    digits = load_digits()
    counts = digits.data.astype(np.int64)
    x = torch.from_numpy((counts / 16.0).astype(np.float32).reshape(-1, 1, 8, 8))  # exact in float32
    return Digits(x, torch.from_numpy(digits.target.astype(np.int64)), counts)


def digits_partition(d: Digits, num_clients: int, seed: int = 42):
    labelled = datasets.Dataset.from_dict({"label": d.y.tolist()})
    return partition_dataset(labelled, num_clients, "dirichlet", alpha=0.3, min_partition_size=2, seed=seed)


def torch_dataset(d: Digits) -> datasets.Dataset:
    """The rows as a user holds them: nested lists in a ``Dataset``, ``set_format("torch")`` (workload 6)."""
    dataset = datasets.Dataset.from_dict({"pixel_values": d.x.numpy().tolist(), "labels": d.y.tolist()})
    dataset.set_format("torch")
    return dataset


def digit_images(batch) -> dict:
    """The on-the-fly transform: raw pixel counts (0-16) -> 1x8x8 float images in [0, 1], and the labels."""
    pixels = torch.tensor(batch["counts"], dtype=torch.float32).div_(16.0).view(-1, 1, 8, 8)
    return {"pixel_values": pixels, "labels": torch.as_tensor(batch["labels"], dtype=torch.int64)}


def deterministic_digit_images(batch) -> dict:
    """:func:`digit_images`, declared deterministic (``transform.deterministic = True``: no random numbers, the same
    batch in, the same output out), so the library may keep its evaluation batches (``runtime.eval_data``)."""
    return digit_images(batch)


deterministic_digit_images.deterministic = True


def transformed_dataset(d: Digits, deterministic: bool = False) -> datasets.Dataset:
    raw = datasets.Dataset.from_dict({"counts": d.counts.tolist(), "labels": d.y.tolist()})
    return raw.with_transform(deterministic_digit_images if deterministic else digit_images)


def digits_model(seed: int = 42) -> torch.nn.Module:
    set_seed(seed)
    return create_model("small_cnn", num_classes=10, in_chans=1, image_size=8, **MODEL_KWARGS)


def plain_evaluator(batches: Callable[[], list[dict]], device: str) -> Callable[[torch.nn.Module], dict]:
    """``evaluate(model)``: the rows of ``batches()`` in eval mode without gradients; the mean loss over the rows
    and the top-1 accuracy (what the library's evaluation reports as ``eval_loss`` and ``eval_accuracy``)."""
    on_cpu = device == "cpu"

    def evaluate(model: torch.nn.Module) -> dict:
        model.eval()
        loss_sum, correct, rows = 0.0, 0, 0
        with torch.no_grad():
            for inputs in batches():
                if not on_cpu:
                    inputs = {k: v.to(device, non_blocking=True) for k, v in inputs.items()}
                out = model(**inputs)
                n = inputs["labels"].shape[0]
                loss_sum += float(out.loss) * n
                correct += int((out.logits.argmax(-1) == inputs["labels"]).sum())
                rows += n
        model.train()
        return {"eval_loss": loss_sum / rows, "eval_accuracy": correct / rows}

    return evaluate


def run_library(label: str, job: Job, make_model, train, eval_dataset, partition, before_round: RoundGate,
                algorithm: str = "fedavg", trainer_kwargs: dict | None = None, **overrides) -> RunTiming:
    """The library's run (``create_trainer``: FederatedTrainer, or the decentralized trainer for a gossip preset),
    timed per round by ``RoundClock``; its per-round eval metrics from ``history.json``."""
    from hf_fedflat import create_trainer

    timing = RunTiming(label)
    with tempfile.TemporaryDirectory(prefix="hf_fedflat_whole_run_") as output_dir:
        args = federated_args(job, algorithm, output_dir, per_device_eval_batch_size=EVAL_BATCH_SIZE,
                              eval_every_n_rounds=1, **overrides)
        trainer = create_trainer(make_model(), args, train, eval_dataset, partition=partition,
                                 label_column="labels", callbacks=[BeforeRound(before_round), RoundClock(timing)],
                                 **(trainer_kwargs or {}))
        output = trainer.train()
        history = json.loads((Path(output_dir) / "history.json").read_text())
    timing.final_params = output.params.detach().float().cpu()
    timing.extra["eval_per_round"] = [{k: v for k, v in r.items() if k.startswith(("eval_", "local_eval_"))}
                                      for r in history]
    return timing


def eval_agreement(library: RunTiming, plain: RunTiming, keys: dict[str, str]) -> dict:
    """The largest per-round difference of each library metric (``keys``: library key -> plain key) from the plain
    loop's: both evaluated the same weights on the same rows (0 for the accuracy when the weights are equal)."""
    out = {}
    for lib_key, plain_key in keys.items():
        pairs = [(a.get(lib_key), b.get(plain_key)) for a, b in
                 zip(library.extra.get("eval_per_round", []), plain.extra.get("eval_per_round", []))]
        pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
        out[lib_key] = max((abs(a - b) for a, b in pairs), default=None)
    out["last_round"] = {k: library.extra["eval_per_round"][-1].get(k) for k in keys} \
        if library.extra.get("eval_per_round") else None
    return out


def record(name: str, num: RunTiming, den: RunTiming, runs, env: dict, agreement: dict | None = None) -> dict:
    target = TARGETS.get(name.removeprefix("whole_run_").removesuffix("_vs_plain_loop"))
    rec = bench.ratio_record(name, target if target is not None else float("inf"), False,
                             f"{num.label} / {den.label}, seconds per timed round", num, den, runs, same_math=True,
                             extra=env)
    if target is None:
        rec["target"], rec["passed"] = None, None
    rec["details"]["whole_run_seconds"] = {side.label: round(sum(side.round_seconds), 3) for side in (num, den)}
    if agreement is not None:
        rec["details"]["eval_max_abs_diff"] = agreement
    return rec


def environment(job: Job | None = None, **extra) -> dict:
    return {"torch_threads": torch.get_num_threads(), "job": dataclasses.asdict(job) if job else None,
            "eval_batch_size": EVAL_BATCH_SIZE,
            "device_name": torch.cuda.get_device_name() if job and job.device == "cuda" else "cpu"} | extra


# ------------------------------------------------------------------------------------------------
# (a) digits, a torch-format Dataset, evaluation every round; (b) the same through a with_transform
# ------------------------------------------------------------------------------------------------
def digits_job(opts, num_clients: int = 100, clients_per_round: int = 10, local_steps: int | None = None) -> Job:
    rounds = opts.rounds or (3 if opts.smoke else 100)
    if opts.smoke:
        num_clients, clients_per_round = min(num_clients, 10), min(clients_per_round, 3)
    return Job(num_rounds=rounds, num_clients=num_clients, clients_per_round=clients_per_round, batch_size=16,
               learning_rate=0.05, local_steps=local_steps, max_grad_norm=10.0, seed=42, device=opts.device)


def section_digits(opts) -> list[dict]:
    d = load_digit_arrays()
    job = digits_job(opts)
    partition = digits_partition(d, job.num_clients, job.seed)
    x, y = d.x.to(job.device), d.y.to(job.device)  # the plain loop's eval rows (on the GPU: copied once)
    eval_rows = len(d.y)
    batches = lambda: [{"pixel_values": x[i:i + EVAL_BATCH_SIZE], "labels": y[i:i + EVAL_BATCH_SIZE]}  # noqa: E731
                       for i in range(0, eval_rows, EVAL_BATCH_SIZE)]
    evaluate = plain_evaluator(batches, job.device)
    plain = Workload("digits", job, digits_model, None, partition,
                     fetch=lambda rows: {"pixel_values": d.x[rows], "labels": d.y[rows]})

    def library(label, with_eval):
        return lambda gate: run_library(label, job, digits_model, torch_dataset(d),
                                        torch_dataset(d) if with_eval else None, partition, gate)

    runners = {"plain_loop": lambda gate: run_plain_fedavg(plain, gate),
               "fedavg": library("fedavg", False),
               "plain_loop_eval": lambda gate: relabel(run_plain_fedavg(plain, gate, evaluate), "plain_loop_eval"),
               "fedavg_eval": library("fedavg_eval", True)}
    load_before = load_average()
    best = bench.lock_step_repeats(runners, repeats(opts), "whole run digits")
    runs = best.pop("_runs")
    env = environment(job, load_avg_before=load_before, load_avg_after=load_average(), eval_rows=eval_rows,
                      data="datasets.Dataset, torch format")
    return [record("whole_run_digits_eval_vs_plain_loop", best["fedavg_eval"], best["plain_loop_eval"], runs, env,
                   eval_agreement(best["fedavg_eval"], best["plain_loop_eval"],
                                  {"eval_accuracy": "eval_accuracy", "eval_loss": "eval_loss"})),
            record("whole_run_digits_no_eval_vs_plain_loop", best["fedavg"], best["plain_loop"], runs, env)]


def section_transform(opts) -> list[dict]:
    d = load_digit_arrays()
    job = digits_job(opts)
    partition = digits_partition(d, job.num_clients, job.seed)
    users = transformed_dataset(d)  # the plain loop's Dataset; the library gets fresh ones (nothing cached)
    eval_rows = len(users)
    batches = lambda: [users[i:i + EVAL_BATCH_SIZE] for i in range(0, eval_rows, EVAL_BATCH_SIZE)]  # noqa: E731
    plain = Workload("transform", job, digits_model, None, partition, fetch=lambda rows: users[rows.tolist()])
    runners = {
        "plain_loop_eval": lambda gate: relabel(run_plain_fedavg(plain, gate, plain_evaluator(batches, job.device)),
                                                "plain_loop_eval"),
        "fedavg_eval": lambda gate: run_library("fedavg_eval", job, digits_model, transformed_dataset(d),
                                                transformed_dataset(d), partition, gate),
        "fedavg_eval_deterministic": lambda gate: run_library(
            "fedavg_eval_deterministic", job, digits_model, transformed_dataset(d, True),
            transformed_dataset(d, True), partition, gate),
    }
    load_before = load_average()
    best = bench.lock_step_repeats(runners, repeats(opts), "whole run transform")
    runs = best.pop("_runs")
    env = environment(job, load_avg_before=load_before, load_avg_after=load_average(), eval_rows=eval_rows,
                      data="datasets.Dataset of raw counts with_transform(digit_images)")
    keys = {"eval_accuracy": "eval_accuracy", "eval_loss": "eval_loss"}
    return [record("whole_run_transform_eval_vs_plain_loop", best["fedavg_eval"], best["plain_loop_eval"], runs, env,
                   eval_agreement(best["fedavg_eval"], best["plain_loop_eval"], keys)),
            record("whole_run_transform_deterministic_eval_vs_plain_loop", best["fedavg_eval_deterministic"],
                   best["plain_loop_eval"], runs, env,
                   eval_agreement(best["fedavg_eval_deterministic"], best["plain_loop_eval"], keys))]


# ------------------------------------------------------------------------------------------------
# (c) decentralized: dfedavg on a ring, every client every round, every local model evaluated
# ------------------------------------------------------------------------------------------------
def ring_weights(n: int) -> np.ndarray:
    """Each client: 1/3 to itself and to each of its two ring neighbours (N <= 3: every client, equally)."""
    if n <= 3:
        return np.full((n, n), 1.0 / n)
    w = np.zeros((n, n))
    for i in range(n):
        for j in (i - 1, i, i + 1):
            w[i, j % n] = 1.0 / 3.0
    return w


def run_plain_gossip(job: Job, partition, fetch, evaluate, before_round: RoundGate = no_gate) -> RunTiming:
    """DFedAvg as a plain loop: every client trains from its own ``x_i`` (SGD, clipping, the Trainer's batch order),
    ``z_i = x_i + (w_i - x_i)``; then ``x_i <- sum_j W_ij z_j`` (float32, increasing ``j``); ``x_bar`` the float64
    mean; ``x_bar`` and every ``x_i`` evaluated."""
    model = digits_model(job.seed)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    n = job.num_clients
    initial = torch.nn.utils.parameters_to_vector(params).detach().clone()
    local = [initial.clone() for _ in range(n)]
    indices = [torch.as_tensor(ix, dtype=torch.int64) for ix in partition.client_indices]
    weights = torch.as_tensor(ring_weights(n), dtype=torch.float64)
    timing = RunTiming("plain_gossip_eval")
    evals = timing.extra.setdefault("eval_per_round", [])
    for round_index in range(job.num_rounds):
        before_round(round_index)
        start, cpu_start = time.perf_counter(), time.process_time()
        z, steps = [], 0
        for client_id in range(n):
            load_flat(params, local[client_id])
            optimizer = torch.optim.SGD(params, lr=job.learning_rate)
            rows = indices[client_id]
            for batch in client_order(job, round_index, client_id, len(rows)):
                loss = model(**fetch(rows[batch])).loss
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, job.max_grad_norm)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                steps += 1
            delta = torch.nn.utils.parameters_to_vector(params).detach() - local[client_id]
            z.append(local[client_id] + delta)
        for i in range(n):
            row = weights[i]
            mixed = torch.zeros_like(initial)
            for j in row.nonzero().flatten().tolist():
                mixed.add_(z[j], alpha=float(row[j]))
            local[i] = mixed
        average = (torch.stack([v.double() for v in local]).sum(0) / n).to(initial.dtype)
        load_flat(params, average)
        metrics = {"average": evaluate(model), "local": []}
        for i in range(n):
            load_flat(params, local[i])
            metrics["local"].append(evaluate(model))
        evals.append({"eval_accuracy": metrics["average"]["eval_accuracy"],
                      "local_eval_accuracy_mean": float(np.mean([m["eval_accuracy"] for m in metrics["local"]]))})
        timing.round_seconds.append(time.perf_counter() - start)
        timing.round_cpu_seconds.append(time.process_time() - cpu_start)
        timing.round_steps.append(steps)
    timing.final_params = (torch.stack([v.double() for v in local]).sum(0) / n).to(initial.dtype)
    return timing


def section_gossip(opts) -> list[dict]:
    d = load_digit_arrays()
    rounds = opts.rounds or (3 if opts.smoke else 30)
    num_clients = 4 if opts.smoke else 10
    job = Job(num_rounds=rounds, num_clients=num_clients, clients_per_round=num_clients, batch_size=16,
              learning_rate=0.05, local_steps=2 if opts.smoke else 5, max_grad_norm=10.0, seed=42)
    partition = digits_partition(d, num_clients, job.seed)
    eval_rows = len(d.y)
    batches = lambda: [{"pixel_values": d.x[i:i + EVAL_BATCH_SIZE], "labels": d.y[i:i + EVAL_BATCH_SIZE]}  # noqa: E731
                       for i in range(0, eval_rows, EVAL_BATCH_SIZE)]
    fetch = lambda rows: {"pixel_values": d.x[rows], "labels": d.y[rows]}  # noqa: E731
    # every client's own model at every evaluation, stated where the arguments have the thinning fields
    every = {k: v for k, v in (("local_eval_every_n_rounds", 1), ("local_eval_clients", num_clients))
             if k in FedTrainingArguments.__dataclass_fields__}
    runners = {
        "plain_gossip_eval": lambda gate: run_plain_gossip(job, partition, fetch, plain_evaluator(batches, "cpu"), gate),
        # every client's own model evaluated every round (local_eval_models = all of them: no thinning)
        "dfedavg_eval": lambda gate: run_library("dfedavg_eval", job, digits_model, torch_dataset(d), torch_dataset(d),
                                                 partition, gate, algorithm="dfedavg", topology="ring",
                                                 trainer_kwargs={"local_eval_models": num_clients}, **every),
    }
    load_before = load_average()
    best = bench.lock_step_repeats(runners, repeats(opts), "whole run gossip")
    runs = best.pop("_runs")
    env = environment(job, load_avg_before=load_before, load_avg_after=load_average(), eval_rows=eval_rows,
                      evaluations_per_round=num_clients + 1, topology="ring")
    return [record("whole_run_gossip_eval_vs_plain_loop", best["dfedavg_eval"], best["plain_gossip_eval"], runs, env,
                   eval_agreement(best["dfedavg_eval"], best["plain_gossip_eval"],
                                  {"eval_accuracy": "eval_accuracy",
                                   "local_eval_accuracy_mean": "local_eval_accuracy_mean"}))]


# ------------------------------------------------------------------------------------------------
# (d) the quickstart as a process
# ------------------------------------------------------------------------------------------------
def quickstart_child(stats_path: str, recipe_argv: list[str]) -> None:
    """Run ``recipes/quickstart.py`` here with its own arguments; write what its rounds spent to ``stats_path``."""
    import runpy

    from hf_fedflat.federation.trainer import FederatedTrainer as Base

    stats = {"local_training_seconds": 0.0, "rounds_seconds": 0.0, "after_aggregation_seconds": 0.0,
             "clients": 0, "rounds": 0, "first_round_begin_epoch": None, "child_start_epoch": time.time()}
    marks: dict[str, float] = {}
    original = Base.call_callbacks

    def call_callbacks(self, hook: str, *args, **kwargs):
        now = time.perf_counter()
        if hook == "on_round_begin":
            marks["round"] = now
            if stats["first_round_begin_epoch"] is None:
                stats["first_round_begin_epoch"] = time.time()
        elif hook == "on_client_end":
            stats["local_training_seconds"] += args[1].train_seconds
            stats["clients"] += 1
        elif hook == "on_aggregate":
            marks["aggregate"] = now
        elif hook == "on_round_end":
            stats["rounds_seconds"] += now - marks.pop("round", now)
            stats["after_aggregation_seconds"] += now - marks.pop("aggregate", now)
            stats["rounds"] += 1
        return original(self, hook, *args, **kwargs)

    Base.call_callbacks = call_callbacks
    sys.argv = [str(REPO_ROOT / "recipes" / "quickstart.py"), *recipe_argv]
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as exit_:
        if exit_.code not in (None, 0):
            raise
    finally:
        stats["child_end_epoch"] = time.time()
        Path(stats_path).write_text(json.dumps(stats) + "\n")


def run_quickstart(recipe_argv: list[str], threads: int, timeout: float, device: str = "cpu") -> dict:
    """The quickstart in a child process: wall seconds from launch to exit and where they went."""
    with tempfile.TemporaryDirectory(prefix="hf_fedflat_quickstart_") as root:
        stats_path = os.path.join(root, "stats.json")
        argv = [*recipe_argv, "--output_dir", os.path.join(root, "out"), "--disable_tqdm", "true"]
        if device == "cpu" and "--use_cpu" not in argv:
            argv += ["--use_cpu", "true"]
        command = [sys.executable, str(Path(__file__).resolve()), "quickstart-child", "--stats", stats_path, "--",
                   *argv]
        launched_epoch, t0 = time.time(), time.perf_counter()
        done = subprocess.run(command, env=bench.child_env(threads), capture_output=True, text=True, timeout=timeout,
                              cwd=REPO_ROOT)
        wall = time.perf_counter() - t0
        if done.returncode != 0:
            raise RuntimeError(f"quickstart exited {done.returncode}: {done.stderr[-2000:]}")
        stats = json.loads(Path(stats_path).read_text())
        accuracies = {}
        for history in sorted(Path(root, "out").glob("*/history.json")):
            last = json.loads(history.read_text())[-1]
            accuracies[history.parent.name] = last.get("eval_accuracy")
    local = stats["local_training_seconds"]
    return {"wall_seconds": round(wall, 2), "local_training_seconds": round(local, 2),
            "share_outside_local_training": round(1 - local / wall, 4),
            "rounds_seconds": round(stats["rounds_seconds"], 2),
            "in_rounds_outside_local_training_seconds": round(stats["rounds_seconds"] - local, 2),
            "after_aggregation_seconds": round(stats["after_aggregation_seconds"], 2),
            "launch_to_first_round_seconds": round(stats["first_round_begin_epoch"] - launched_epoch, 2)
            if stats["first_round_begin_epoch"] else None,
            "outside_rounds_seconds": round(wall - stats["rounds_seconds"], 2),
            "rounds": stats["rounds"], "clients_trained": stats["clients"], "final_eval_accuracy": accuracies,
            "argv": recipe_argv}


def section_quickstart(opts) -> list[dict]:
    recipe_argv = ["--smoke"] if opts.smoke else []
    if opts.rounds and not opts.smoke:
        recipe_argv += ["--num_rounds", str(opts.rounds)]
    load_before = load_average()
    result = run_quickstart(recipe_argv, opts.threads, 3600, opts.device)
    log(f"quickstart: {result['wall_seconds']} s wall, {result['local_training_seconds']} s local training, "
        f"{result['share_outside_local_training']:.1%} outside it")
    details = result | {"ratio_is": "share of the wall time outside the clients' local training",
                        "raw": f"{result['wall_seconds']} s wall, {result['local_training_seconds']} s training",
                        "load_avg_before": load_before, "load_avg_after": load_average(),
                        "command": "python recipes/quickstart.py " + " ".join(recipe_argv)}
    return [{"name": "whole_run_quickstart_share_outside_local_training",
             "ratio": result["share_outside_local_training"], "target": None, "passed": None, "details": details}]


# ------------------------------------------------------------------------------------------------
# (e) the BERT text workload with evaluation every round
# ------------------------------------------------------------------------------------------------
def section_text(opts) -> list[dict]:
    import shutil

    import text_models

    from hf_fedflat.federation.comm import init_federated_process_group

    init_federated_process_group()
    rounds = opts.rounds or (2 if opts.smoke else 10)
    root = tempfile.mkdtemp(prefix="hf_fedflat_whole_run_text_")
    try:
        assets = text_models.write_assets(root)
        # text_models' flags evaluate every round (--eval_every_n_rounds 1), its plain loop too
        runners = {"plain_loop_eval": lambda gate: relabel(text_models.run_plain("bert", assets, rounds, gate),
                                                           "plain_loop_eval"),
                   "fedavg_eval": lambda gate: relabel(text_models.run_federated("bert", "fedavg", assets, rounds,
                                                                                 gate), "fedavg_eval")}
        load_before = load_average()
        best = bench.lock_step_repeats(runners, repeats(opts, default=3), "whole run text")
        runs = best.pop("_runs")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    env = environment(None, load_avg_before=load_before, load_avg_after=load_average(), rounds=rounds,
                      eval_batch_size="text_models' (the library default, 128; 200 evaluation rows)",
                      accuracy_per_round={k: best[k].extra.get("per_round") for k in runners})
    return [record("whole_run_text_bert_eval_vs_plain_loop", best["fedavg_eval"], best["plain_loop_eval"], runs, env)]


# ------------------------------------------------------------------------------------------------
# --profile: one evaluated round of row (a) under cProfile
# ------------------------------------------------------------------------------------------------
PROFILED_ROUND = 5


def profile_digits_round(opts) -> dict:
    """Row (a) on both sides, round :data:`PROFILED_ROUND` profiled: ``{side: pstats.Stats}``, printed."""
    import cProfile
    import io
    import pstats

    d = load_digit_arrays()
    job = digits_job(argparse.Namespace(rounds=max(opts.rounds or 12, PROFILED_ROUND + 2), smoke=False,
                                        device=opts.device))
    partition = digits_partition(d, job.num_clients, job.seed)
    x, y = d.x.to(job.device), d.y.to(job.device)
    batches = lambda: [{"pixel_values": x[i:i + EVAL_BATCH_SIZE], "labels": y[i:i + EVAL_BATCH_SIZE]}  # noqa: E731
                       for i in range(0, len(d.y), EVAL_BATCH_SIZE)]
    plain = Workload("digits", job, digits_model, None, partition,
                     fetch=lambda rows: {"pixel_values": d.x[rows], "labels": d.y[rows]})
    sides = {"fedavg_eval": lambda gate: run_library("fedavg_eval", job, digits_model, torch_dataset(d),
                                                     torch_dataset(d), partition, gate),
             "plain_loop_eval": lambda gate: run_plain_fedavg(plain, gate, plain_evaluator(batches, job.device))}
    stats = {}
    for name, run_side in sides.items():
        profiler, on = cProfile.Profile(), [False]

        def gate(round_index: int) -> None:  # a round runs from its gate to the next round's gate
            if on[0]:
                profiler.disable()
                on[0] = False
            if round_index == PROFILED_ROUND:
                profiler.enable()
                on[0] = True

        run_side(gate)
        if on[0]:
            profiler.disable()
        stats[name] = pstats.Stats(profiler)
    library, plain_stats = stats["fedavg_eval"], stats["plain_loop_eval"]
    out = io.StringIO()
    library.stream = out
    library.sort_stats(opts.profile_sort).print_stats(15)
    print(f"round {PROFILED_ROUND + 1} of {job.num_rounds} (row (a): FedAvg, {job.clients_per_round} clients, the "
          f"global model evaluated on {len(d.y)} rows), torch threads {torch.get_num_threads()}, load "
          f"{load_average()}")
    print(f"Python function calls in the round: library {library.total_calls:,}, plain loop "
          f"{plain_stats.total_calls:,}; seconds under the profiler: library {library.total_tt:.3f}, plain loop "
          f"{plain_stats.total_tt:.3f}")
    print(f"library, top 15 by {opts.profile_sort}:")
    print(out.getvalue())
    return stats


# ------------------------------------------------------------------------------------------------
def relabel(timing: RunTiming, label: str) -> RunTiming:
    timing.label = label
    return timing


def repeats(opts, default: int = 2) -> int:
    return opts.repeats or (1 if opts.smoke else default)


SECTIONS = {"digits": section_digits, "transform": section_transform, "gossip": section_gossip,
            "quickstart": section_quickstart, "text": section_text}


def format_records(records: list[dict]) -> str:
    lines = []
    for r in records:
        d = r["details"]
        verdict = "no target" if r["target"] is None else f"target <= {r['target']}, {'met' if r['passed'] else 'MISSED'}"
        diff = d.get("max_abs_weight_diff")
        lines.append(f"{r['name']}: {r['ratio']} ({verdict}) {d.get('raw', '')}"
                     + (f"; max |dw| {diff:.2e}" if diff is not None else "")
                     + (f"; load {d['load_avg_before']} -> {d['load_avg_after']}" if "load_avg_before" in d else ""))
    return "\n".join(lines)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    child = sub.add_parser("quickstart-child", help="Run recipes/quickstart.py instrumented (run by 'quickstart').")
    child.add_argument("--stats", required=True)
    child.add_argument("recipe_argv", nargs=argparse.REMAINDER)
    parser.add_argument("--smoke", action="store_true", help="Tiny sizes: a check that every section runs.")
    parser.add_argument("--only", default="digits,transform,gossip,quickstart,text",
                        help=f"Comma-separated sections of {list(SECTIONS)}.")
    parser.add_argument("--rounds", type=int, default=None, help="Rounds of every section (default per section).")
    parser.add_argument("--repeats", type=int, default=None, help="Lock-step repeats (default 2; text 3; smoke 1).")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="Where both sides of digits and transform run (gossip and text stay on the CPU).")
    parser.add_argument("--profile", action="store_true",
                        help="cProfile one evaluated round of row (a) on both sides (prints; runs no section).")
    parser.add_argument("--profile-sort", default="cumulative", choices=("cumulative", "tottime"),
                        help="The order of --profile's top 15 (default cumulative).")
    parser.add_argument("--output", default=None, help="JSON list of records (default benchmarks/whole_run.json; "
                                                       "--smoke: none unless given).")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> list[dict]:
    opts = parse_args(argv)
    if opts.command == "quickstart-child":
        rest = opts.recipe_argv[1:] if opts.recipe_argv[:1] == ["--"] else opts.recipe_argv
        quickstart_child(opts.stats, rest)
        return []
    torch.set_num_threads(opts.threads)
    if opts.profile:
        profile_digits_round(opts)
        return []
    output = Path(opts.output) if opts.output else (None if opts.smoke else HERE / "whole_run.json")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True).stdout.strip()
    records: list[dict] = []
    for name in [s.strip() for s in opts.only.split(",") if s.strip()]:
        if name not in SECTIONS:
            raise SystemExit(f"--only: unknown section {name!r}; choose from {list(SECTIONS)}")
        t0 = time.perf_counter()
        new = SECTIONS[name](opts)
        for rec in new:
            rec["details"]["section_seconds"] = round(time.perf_counter() - t0, 1)
            rec["details"]["date"] = time.strftime("%Y-%m-%d")
            rec["details"]["commit"] = commit
        records += new
        log(format_records(new))
        if output is not None:
            output.write_text(json.dumps(records, indent=1, default=str) + "\n")  # after every section
    print(format_records(records))
    return records


if __name__ == "__main__":
    main()
