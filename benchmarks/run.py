"""Wall-time benchmarks of the federated round loop (CPU, one process).

    python benchmarks/run.py [--quick] [--output benchmarks/results.json] [--profile]

Every measurement runs the same federated setting: scikit-learn digits (train split, upscaled to
16x16), partitioned once over 100 clients with ``hf_fedflat``'s Dirichlet(0.3) partition, the
``small_cnn`` model, 10 clients per round (``sample_clients``), 1 local epoch, batch 16, SGD lr 0.05,
gradient clipping at norm 10 (the library's default), no evaluation. Every run starts from the same
initial weights (``set_seed`` before ``create_model``) and visits the same clients in the same order,
so every side does the same optimizer steps; the script asserts equal step counts.

Timing: ``time.perf_counter`` per round; round 0 of every run is a warm-up and is not timed, the
rest are averaged. The runs of a comparison are repeated, interleaved (A B, B A, ...), and each round
keeps its fastest time over the repeats (every repeat does identical work per round): the usual
defence against noise on a shared 2-core VM. Defaults: 20 rounds x 5 repeats (naive row: 6 rounds
x 2, its rounds take ~4 s); ``--quick``: 10 x 3 (naive 4 x 1). ``torch`` threads: default. Before
any timing, every side runs once untimed (see :func:`warm_up_process`).

Rows (ratio of seconds per timed round):

1. ``fedavg_vs_plain_loop``: ``FederatedTrainer`` (FedAvg) / a plain PyTorch loop doing the same
   FedAvg (same clients, same DataLoader shuffles, same steps, same clipping, same aggregation).
2. ``<algorithm>_vs_fedavg``: FedSAM, SCAFFOLD, FedGAMMA / FedAvg, all through ``FederatedTrainer``.
3. ``naive_trainer_per_client_speedup``: a new ``TrainingArguments`` + ``transformers.Trainer`` per
   client per round (the pattern of many federated fine-tuning examples) / ``FederatedTrainer``.

Prints a Markdown table and writes a JSON list of ``{"name", "ratio", "target", "passed", "details"}``;
``details`` holds both sides' per-round times and steps, and ``ratio_second_half``: the ratio over the
later half of the rounds, when most clients' datasets are already built (closer to a long run's
steady state; ``Dataset.select`` per new client is a shared cost that dilutes the early rounds).
``--profile`` also prints the cProfile of one (non-warm-up) FedAvg round.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import cProfile  # noqa: E402
import dataclasses  # noqa: E402
import gc  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import pstats  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import transformers  # noqa: E402
from torch.nn.utils import parameters_to_vector  # noqa: E402
from torch.utils.data import DataLoader, RandomSampler  # noqa: E402
from transformers import Trainer, TrainingArguments, set_seed  # noqa: E402
from transformers.trainer_callback import PrinterCallback  # noqa: E402

from hf_fedflat import FederatedCallback, FedTrainingArguments, FederatedTrainer, list_algorithms  # noqa: E402
from hf_fedflat.data import ClientPartition, load_digits_dataset, partition_dataset  # noqa: E402
from hf_fedflat.federation import derive_seed, sample_clients  # noqa: E402
from hf_fedflat.models import create_model  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
#: per-round time of each algorithm / FedAvg must stay at or under these
ALGORITHM_TARGETS = {"fedsam": 2.2, "scaffold": 1.10, "fedgamma": 2.2}


# ------------------------------------------------------------------------------------------------
# The shared setting
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Setting:
    """The federated experiment every measurement runs (the brief's setting)."""

    num_rounds: int
    num_clients: int = 100
    clients_per_round: int = 10
    local_epochs: float = 1.0
    batch_size: int = 16
    learning_rate: float = 0.05
    max_grad_norm: float = 10.0  # FedTrainingArguments' default; the plain loop clips the same way
    dirichlet_alpha: float = 0.3
    min_partition_size: int = 2  # FedTrainingArguments' default
    seed: int = 42
    image_size: int = 16


@dataclass
class Data:
    """The transformed digits train split and its partition (made once, shared by every run)."""

    train: object
    partition: ClientPartition


class ClientSubsets:
    """One run's client datasets, built on a client's first visit and kept, as ``FederatedTrainer`` does.

    (``partition.client_dataset`` is a ``Dataset.select``, which hashes the transform for a new
    fingerprint: ~5 ms here; every side pays it once per client, inside the timed rounds.)
    """

    def __init__(self, data: Data):
        self.data = data
        self._cache: dict[int, object] = {}

    def __getitem__(self, client_id: int):
        if client_id not in self._cache:
            self._cache[client_id] = self.data.partition.client_dataset(self.data.train, client_id)
        return self._cache[client_id]


def load_data(setting: Setting) -> Data:
    """The digits train split (with its on-the-fly transform) and its Dirichlet partition."""
    train = load_digits_dataset(image_size=setting.image_size, seed=setting.seed)["train"]
    partition = partition_dataset(
        train, setting.num_clients, "dirichlet", alpha=setting.dirichlet_alpha,
        min_partition_size=setting.min_partition_size, seed=setting.seed,
    )
    return Data(train=train, partition=partition)


def fresh_model(setting: Setting) -> torch.nn.Module:
    """The same initial ``small_cnn`` weights for every run."""
    set_seed(setting.seed)
    return create_model("small_cnn", num_classes=10, in_chans=1, image_size=setting.image_size)


def round_clients(setting: Setting, round_index: int) -> list[int]:
    """The clients of a round, drawn exactly as ``FederatedTrainer`` draws them."""
    return sample_clients(setting.num_clients, setting.clients_per_round, setting.seed, round_index)


def fedavg_weights(data: Data, clients: list[int]) -> list[float]:
    """FedAvg's aggregation weights ``n_i / sum n_j`` (float64, as the library computes them)."""
    sizes = torch.tensor([data.partition.num_samples[c] for c in clients], dtype=torch.float64)
    return (sizes / sizes.sum()).tolist()


@torch.no_grad()
def load_flat(params: list[torch.Tensor], flat: torch.Tensor) -> None:
    """Copy a flat vector into the parameters (``vector_to_parameters`` would alias its storage)."""
    offset = 0
    for p in params:
        p.copy_(flat[offset:offset + p.numel()].view_as(p))
        offset += p.numel()


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------
# Timing record
# ------------------------------------------------------------------------------------------------
@dataclass
class RunTiming:
    """Per-round wall times and work of one run; round 0 is the warm-up."""

    label: str
    round_seconds: list[float] = field(default_factory=list)
    round_steps: list[int] = field(default_factory=list)  # optimizer steps per round (all clients)
    gradient_passes: int | None = None  # forward+backward passes over the whole run, when known
    final_params: torch.Tensor | None = None

    @property
    def timed_seconds(self) -> list[float]:
        return self.round_seconds[1:]

    @property
    def seconds_per_round(self) -> float:
        return statistics.fmean(self.timed_seconds)

    def summary(self) -> dict:
        return {
            "seconds_per_round": round(self.seconds_per_round, 5),
            "median_seconds_per_round": round(statistics.median(self.timed_seconds), 5),
            "round_seconds": [round(s, 5) for s in self.round_seconds],
            "steps_per_round": self.round_steps,
            "ms_per_step": round(1000 * sum(self.timed_seconds) / sum(self.round_steps[1:]), 3),
            "gradient_passes": self.gradient_passes,
        }


def assert_same_work(a: RunTiming, b: RunTiming) -> None:
    """Both runs must have done exactly the same optimizer steps in every round."""
    if a.round_steps != b.round_steps:
        raise AssertionError(f"unequal work: {a.label} steps/round {a.round_steps} vs {b.label} {b.round_steps}")


def best_of(runs: list[RunTiming]) -> RunTiming:
    """Each round's fastest time over the repeats (every repeat does identical work per round).

    The minimum is the time least disturbed by other load on the machine; taking it per round
    rather than per run also drops a spike that hits one round of an otherwise clean repeat.
    """
    first = runs[0]
    for run in runs[1:]:
        assert_same_work(first, run)
    return RunTiming(
        label=first.label,
        round_seconds=[min(times) for times in zip(*(r.round_seconds for r in runs))],
        round_steps=list(first.round_steps),
        gradient_passes=first.gradient_passes,
        final_params=first.final_params,
    )


# ------------------------------------------------------------------------------------------------
# 1. The plain PyTorch loop
# ------------------------------------------------------------------------------------------------
def run_plain_loop(setting: Setting, data: Data) -> RunTiming:
    """FedAvg written as a plain PyTorch loop: the lower bound for the same mathematics.

    Per round: the same sampled clients; per client: load the global weights, one pass of shuffled
    minibatches from a ``DataLoader`` over the same ``datasets`` client subset (same transform), SGD
    steps with the same clipping; the sample-weighted mean of the deltas is added to the global weights.
    The shuffle of client ``c`` in round ``t`` is ``randperm`` seeded with ``derive_seed(seed, t, c)``,
    which is also what the Trainer's (accelerate's seedable) sampler draws after the library's
    per-client ``set_seed``, so both runs should visit the same batches and end at (nearly) the same
    weights (reported as ``max_abs_weight_diff``).
    """
    model = fresh_model(setting)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    global_params = parameters_to_vector(params).detach().clone()
    subsets = ClientSubsets(data)
    timing = RunTiming("plain_loop")
    epochs = math.ceil(setting.local_epochs)
    for round_index in range(setting.num_rounds):
        start = time.perf_counter()
        clients = round_clients(setting, round_index)
        total_delta = torch.zeros_like(global_params)
        steps = 0
        for client_id, weight in zip(clients, fedavg_weights(data, clients)):
            load_flat(params, global_params)
            optimizer = torch.optim.SGD(params, lr=setting.learning_rate)
            subset = subsets[client_id]
            sampler = RandomSampler(subset, generator=torch.Generator().manual_seed(
                derive_seed(setting.seed, round_index, client_id)))
            loader = DataLoader(subset, batch_size=setting.batch_size, sampler=sampler)
            for _ in range(epochs):
                for batch in loader:
                    loss = model(pixel_values=batch["pixel_values"], labels=batch["labels"]).loss
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(params, setting.max_grad_norm)
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                    steps += 1
            total_delta.add_(parameters_to_vector(params).detach() - global_params, alpha=weight)
        global_params = global_params + total_delta
        timing.round_seconds.append(time.perf_counter() - start)
        timing.round_steps.append(steps)
    timing.final_params = global_params
    timing.gradient_passes = sum(timing.round_steps)
    return timing


# ------------------------------------------------------------------------------------------------
# 2. FederatedTrainer (any algorithm)
# ------------------------------------------------------------------------------------------------
class RoundClock(FederatedCallback):
    """Times each round from ``on_round_begin`` to ``on_round_end`` and counts its optimizer steps.

    The interval holds everything the round loop does for a round: payload, local training,
    aggregation, client-state store, the history write. Only ``sample_clients`` (~0.05 ms, timed on
    the plain-loop side) and the final model save after the last round are outside it.
    """

    def __init__(self, timing: RunTiming, profile_round: int | None = None):
        self.timing = timing
        self.profile_round = profile_round
        self.profiler: cProfile.Profile | None = None
        self._start = 0.0
        self._steps = 0

    def on_round_begin(self, trainer, round_index, clients, **kwargs):
        self._steps = 0
        if round_index == self.profile_round:
            self.profiler = cProfile.Profile()
            self.profiler.enable()
        self._start = time.perf_counter()

    def on_client_end(self, trainer, round_index, update, **kwargs):
        self._steps += update.num_steps

    def on_round_end(self, trainer, round_index, record, **kwargs):
        self.timing.round_seconds.append(time.perf_counter() - self._start)
        self.timing.round_steps.append(self._steps)
        if round_index == self.profile_round:
            self.profiler.disable()


def federated_arguments(setting: Setting, algorithm: str, output_dir: str) -> FedTrainingArguments:
    """The setting as ``FedTrainingArguments`` (no eval, no checkpoints, no logging integrations)."""
    return FedTrainingArguments(
        output_dir=output_dir, fed_algorithm=algorithm, num_clients=setting.num_clients,
        clients_per_round=setting.clients_per_round, num_rounds=setting.num_rounds,
        local_epochs=setting.local_epochs, learning_rate=setting.learning_rate,
        per_device_train_batch_size=setting.batch_size, max_grad_norm=setting.max_grad_norm,
        partition_scheme="dirichlet", dirichlet_alpha=setting.dirichlet_alpha,
        min_partition_size=setting.min_partition_size, seed=setting.seed,
        report_to="none", disable_tqdm=True, use_cpu=True,
    )


def run_federated(setting: Setting, data: Data, algorithm: str = "fedavg",
                  profile_round: int | None = None) -> tuple[RunTiming, cProfile.Profile | None]:
    """``FederatedTrainer.train()`` with ``algorithm``; training only (``eval_dataset=None``)."""
    timing = RunTiming(algorithm)
    clock = RoundClock(timing, profile_round)
    with tempfile.TemporaryDirectory(prefix="hf_fedflat_bench_") as output_dir:
        args = federated_arguments(setting, algorithm, output_dir)
        trainer = FederatedTrainer(fresh_model(setting), args, data.train, None,
                                   partition=data.partition, callbacks=[clock])
        output = trainer.train()
    timing.final_params = output.params
    timing.gradient_passes = trainer.client_trainer.gradient_passes
    return timing, clock.profiler


# ------------------------------------------------------------------------------------------------
# 3. The naive way: a new Trainer per client per round
# ------------------------------------------------------------------------------------------------
def naive_training_arguments(setting: Setting, output_dir: str, seed: int) -> TrainingArguments:
    """The settings ``FederatedTrainer`` gives its local Trainer, so only object churn differs."""
    return TrainingArguments(
        output_dir=output_dir, per_device_train_batch_size=setting.batch_size,
        learning_rate=setting.learning_rate, num_train_epochs=setting.local_epochs, optim="sgd",
        lr_scheduler_type="constant", max_grad_norm=setting.max_grad_norm, weight_decay=0.0,
        save_strategy="no", eval_strategy="no", logging_strategy="no", report_to="none",
        disable_tqdm=True, remove_unused_columns=False, dataloader_pin_memory=False,
        use_cpu=True, seed=seed,
    )


def run_naive_trainer(setting: Setting, data: Data) -> RunTiming:
    """FedAvg with a NEW ``TrainingArguments`` and ``transformers.Trainer`` per client per round.

    Same model object (global weights loaded in place, as such examples do with
    ``load_state_dict``), same clients, same per-client seed (the Trainer seeds its sampler from it),
    same Trainer settings as ``FederatedTrainer``'s local Trainer, same aggregation. What differs
    is only building (and tearing down) a Trainer for every client.
    """
    model = fresh_model(setting)
    params = [p for p in model.parameters() if p.requires_grad]
    global_params = parameters_to_vector(params).detach().clone()
    subsets = ClientSubsets(data)
    timing = RunTiming("naive_trainer")
    with tempfile.TemporaryDirectory(prefix="hf_fedflat_bench_naive_") as output_dir:
        for round_index in range(setting.num_rounds):
            start = time.perf_counter()
            clients = round_clients(setting, round_index)
            total_delta = torch.zeros_like(global_params)
            steps = 0
            for client_id, weight in zip(clients, fedavg_weights(data, clients)):
                load_flat(params, global_params)
                args = naive_training_arguments(setting, output_dir, derive_seed(setting.seed, round_index, client_id))
                trainer = Trainer(model=model, args=args, train_dataset=subsets[client_id])
                trainer.remove_callback(PrinterCallback)  # keep stdout for the table (printing is cheap)
                trainer.train()
                steps += trainer.state.global_step
                total_delta.add_(parameters_to_vector(params).detach() - global_params, alpha=weight)
            global_params = global_params + total_delta
            timing.round_seconds.append(time.perf_counter() - start)
            timing.round_steps.append(steps)
    timing.final_params = global_params
    timing.gradient_passes = sum(timing.round_steps)
    return timing


# ------------------------------------------------------------------------------------------------
# Comparisons
# ------------------------------------------------------------------------------------------------
def warm_up_process(setting: Setting, data: Data) -> None:
    """Untimed runs before any measurement, so no side pays the process's one-time costs.

    Without it the first run of the process was measured ~1.6x slower than later ones, even after
    its own warm-up round; part of it is the first use of each batch shape (clients end on batches
    of 1..15 rows; a new shape costs ~2.5 ms once), the rest one-time caches and heap growth.
    """
    model = fresh_model(setting)
    for batch_size in range(1, setting.batch_size + 1):
        x = torch.zeros(batch_size, 1, setting.image_size, setting.image_size)
        model(pixel_values=x, labels=torch.zeros(batch_size, dtype=torch.long)).loss.backward()
    short = dataclasses.replace(setting, num_rounds=min(setting.num_rounds, 3))
    for algorithm in ("fedavg", *ALGORITHM_TARGETS):
        run_federated(short, data, algorithm)
    run_plain_loop(short, data)


@dataclass(frozen=True)
class Comparison:
    """One row: ratio = seconds per timed round of ``numerator`` / ``denominator``."""

    name: str
    target: float
    higher_is_better: bool  # True for a speed-up (the slow side is the numerator)
    ratio_label: str
    same_math: bool  # both sides compute the same weights (then their final weights are compared)


def compare(spec: Comparison, numerator: Callable[[], RunTiming], denominator: Callable[[], RunTiming],
            repeats: int) -> dict:
    """Interleave ``repeats`` runs of both sides, keep each round's fastest time, return the JSON record.

    The order alternates (A B, B A, A B, ...) so a drift of the machine's speed hits both sides alike.
    Python's automatic garbage collection stays on (it is part of the real cost), but a full
    collection is done before each run, outside the timing.
    """
    runs_num, runs_den = [], []
    for repeat in range(repeats):
        pair = ((numerator, runs_num), (denominator, runs_den))
        for runner, runs in (pair if repeat % 2 == 0 else pair[::-1]):
            gc.collect()  # same start for every run: a full collection (~0.5 s here) is not owed to the next
            t0 = time.perf_counter()
            runs.append(runner())
            log(f"{spec.name}: repeat {repeat + 1}/{repeats} {runs[-1].label}: "
                f"{runs[-1].seconds_per_round * 1000:.1f} ms/round ({time.perf_counter() - t0:.1f} s total)")
    num, den = best_of(runs_num), best_of(runs_den)
    assert_same_work(num, den)
    ratio = num.seconds_per_round / den.seconds_per_round
    half = len(num.round_seconds) // 2  # later rounds: most clients' datasets already built (steady state)
    later_ratio = statistics.fmean(num.round_seconds[max(1, half):]) / statistics.fmean(den.round_seconds[max(1, half):])
    passed = ratio >= spec.target if spec.higher_is_better else ratio <= spec.target
    details = {
        "ratio_is": spec.ratio_label,
        "comparison": ">=" if spec.higher_is_better else "<=",
        "numerator": num.label,
        "denominator": den.label,
        "timed_rounds": len(num.timed_seconds),
        "repeats": repeats,
        "ratio_second_half": round(later_ratio, 4),
        num.label: num.summary(),
        den.label: den.summary(),
        "repeat_seconds_per_round": {num.label: [round(r.seconds_per_round, 5) for r in runs_num],
                                     den.label: [round(r.seconds_per_round, 5) for r in runs_den]},
    }
    if spec.same_math:
        diff = float((num.final_params - den.final_params).abs().max())
        details["max_abs_weight_diff"] = diff
        if diff > 1e-4:
            log(f"WARNING {spec.name}: final weights differ by {diff:.2e}; the two sides did not compute the same thing")
    return {"name": spec.name, "ratio": round(ratio, 4), "target": spec.target, "passed": bool(passed), "details": details}


def profile_report(profiler: cProfile.Profile, limit: int = 35) -> str:
    """Top functions by own time and by cumulative time."""
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(limit)
    stats.sort_stats("cumulative").print_stats(limit)
    return out.getvalue()


# ------------------------------------------------------------------------------------------------
# Output
# ------------------------------------------------------------------------------------------------
def format_table(records: list[dict]) -> str:
    lines = [
        "| benchmark | ratio | target | pass | ratio, 2nd half | numerator s/round | denominator s/round "
        "| steps/round | max abs dW |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        d = r["details"]
        num, den = d["numerator"], d["denominator"]
        diff = f"{d['max_abs_weight_diff']:.1e}" if "max_abs_weight_diff" in d else "n/a"
        lines.append(
            f"| {r['name']} | {r['ratio']:.3f} ({d['ratio_is']}) | {d['comparison']} {r['target']} | "
            f"{'yes' if r['passed'] else 'NO'} | {d['ratio_second_half']:.3f} | {num} {d[num]['seconds_per_round']:.4f} | "
            f"{den} {d[den]['seconds_per_round']:.4f} | {statistics.fmean(d[num]['steps_per_round'][1:]):.1f} | {diff} |"
        )
    return "\n".join(lines)


def format_rounds(records: list[dict]) -> str:
    """Per-round times of every side (round 0 = warm-up, excluded from the means)."""
    lines = []
    for r in records:
        d = r["details"]
        for side in (d["numerator"], d["denominator"]):
            summary = d[side]
            rounds = " ".join(f"{x * 1000:.0f}" for x in summary["round_seconds"])
            lines.append(f"- {r['name']} / {side}: mean {summary['seconds_per_round'] * 1000:.1f} ms/round, "
                         f"ms per round [{rounds}], steps per round {summary['steps_per_round']}, "
                         f"{summary['ms_per_step']:.2f} ms/step")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="Fewer rounds and repeats (~2 min instead of ~5).")
    parser.add_argument("--output", default=str(REPO_ROOT / "benchmarks" / "results.json"), help="JSON results file.")
    parser.add_argument("--rounds", type=int, default=None,
                        help="Rounds per run, incl. the warm-up round (default 20, quick 10).")
    parser.add_argument("--naive-rounds", type=int, default=None,
                        help="Rounds of the naive-Trainer comparison, ~4 s each (default 6, quick 4).")
    parser.add_argument("--repeats", type=int, default=None, help="Interleaved repeats per comparison (default 5, quick 3).")
    parser.add_argument("--profile", action="store_true", help="Also print the cProfile of one timed FedAvg round.")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> list[dict]:
    opts = parse_args(argv)
    rounds = opts.rounds or (10 if opts.quick else 20)
    naive_rounds = opts.naive_rounds or (4 if opts.quick else 6)
    repeats = opts.repeats or (3 if opts.quick else 5)
    naive_repeats = 1 if opts.quick else 2
    if min(rounds, naive_rounds) < 2 or repeats < 1:
        raise SystemExit("rounds must be >= 2 (round 0 is the warm-up) and repeats >= 1")
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()  # the final-model save's "Writing model shards" bar
    started = time.perf_counter()
    setting = Setting(num_rounds=rounds)
    log(f"setting: {setting}; repeats={repeats}; naive: {naive_rounds} rounds x {naive_repeats}; "
        f"torch threads={torch.get_num_threads()}")
    data = load_data(setting)
    log(f"partition: {setting.num_clients} clients of {min(data.partition.num_samples)}.."
        f"{max(data.partition.num_samples)} rows; algorithms available: {list_algorithms()}")

    warm_up_process(setting, data)
    log("process warm-up done")

    def fed(algorithm: str, s: Setting = setting) -> Callable[[], RunTiming]:
        return lambda: run_federated(s, data, algorithm)[0]

    records = [compare(
        Comparison("fedavg_vs_plain_loop", 1.10, False, "fedavg / plain loop", same_math=True),
        fed("fedavg"), lambda: run_plain_loop(setting, data), repeats,
    )]
    for algorithm, target in ALGORITHM_TARGETS.items():
        records.append(compare(
            Comparison(f"{algorithm}_vs_fedavg", target, False, f"{algorithm} / fedavg", same_math=False),
            fed(algorithm), fed("fedavg"), repeats,
        ))
    naive_setting = dataclasses.replace(setting, num_rounds=naive_rounds)
    records.append(compare(
        Comparison("naive_trainer_per_client_speedup", 1.0, True, "speed-up: naive / ours", same_math=True),
        lambda: run_naive_trainer(naive_setting, data), fed("fedavg", naive_setting), naive_repeats,
    ))
    for record in records:
        record["details"]["setting"] = dataclasses.asdict(
            naive_setting if record["name"].startswith("naive") else setting)

    print("\n" + format_table(records))
    print("\nPer-round wall times (round 0 is the warm-up):\n" + format_rounds(records))
    output = Path(opts.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(records, indent=2) + "\n")
    log(f"wrote {output}; benchmarks took {time.perf_counter() - started:.0f} s")

    if opts.profile:
        _, profiler = run_federated(setting, data, "fedavg", profile_round=1)
        print("\ncProfile of FedAvg round 1 (FederatedTrainer):\n" + profile_report(profiler))
    return records


if __name__ == "__main__":
    main()
