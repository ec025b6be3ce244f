"""Several clients at once in one process (for a GPU): rounds per second at ``concurrent_clients`` K.

    python benchmarks/concurrent_clients.py [--ks 1,2,4] [--rounds 6] [--device cpu|cuda] [--bf16]
                                            [--output benchmarks/concurrent_clients.json]
    accelerate launch --config_file accelerate_configs/single_gpu_4proc.yaml benchmarks/concurrent_clients.py --ks 1,2
                                            # 4 processes packed on one GPU, K clients at once in each

The FEMNIST job's shape with small client data: LEAF's FEMNIST CNN (``small_cnn`` at 1x28x28, 32/64 5x5
convolutions, a 2048-unit dense layer, 62 classes: 6.6M parameters), 100 clients of 20 generated 28x28 images
each (FEMNIST's shapes; FEMNIST writers have ~200), 10 clients per round, FedAvg, batch 10, one local epoch
(2 optimizer steps per client), SGD lr 0.05. For each K the same run is timed round by round (the first round,
which builds the lanes and warms up, is not timed), in wall time and in the process's CPU time (on a shared
machine more threads also take a larger share of the cores from other processes: compare both). Every K's
final weights are compared with the first K's (``max_abs_weight_diff``: 0 on a CPU; on a GPU cuDNN's kernels
need not be deterministic, at K=1 either: the run records the difference).

On a CPU the steps of the lanes take turns (the random generators are shared, see
``hf_fedflat.runtime.lanes``), so no speed-up is expected there; the number that matters is the GPU's
(not measured in the session that wrote this: no GPU). Under ``accelerate launch`` every process trains its
share (the main process times the rounds, and its own CPU time only; ``machine.processes`` records how
many). FLUTE's published FEMNIST figure is 0.33 s per round (1,500 rounds in 8 min 22 s); the target set for
this mechanism is >= 3x its rounds per second on one GPU.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import datasets  # noqa: E402
import torch  # noqa: E402

from hf_fedflat import FedTrainingArguments, FederatedCallback, FederatedTrainer, init_process_group  # noqa: E402
from hf_fedflat.models import create_model  # noqa: E402

FLUTE_SECONDS_PER_ROUND = 502 / 1500  # 8 min 22 s for 1,500 rounds


class RoundTimes(FederatedCallback):
    def __init__(self):
        self.started, self.seconds, self.started_cpu, self.cpu_seconds = 0.0, [], 0.0, []

    def on_round_begin(self, trainer, round_index, clients, **kwargs):
        if trainer.args.use_cpu is False and torch.cuda.is_available():
            torch.cuda.synchronize()
        self.started, self.started_cpu = time.perf_counter(), time.process_time()

    def on_aggregate(self, trainer, round_index, updates, **kwargs):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.seconds.append(time.perf_counter() - self.started)
        self.cpu_seconds.append(time.process_time() - self.started_cpu)


def femnist_like(rows: int, seed: int = 0) -> datasets.Dataset:
    """``rows`` 1x28x28 images in [0, 1] with 62 classes, as a ``torch``-format ``Dataset``."""
    generator = torch.Generator().manual_seed(seed)
    pixels = torch.rand(rows, 1, 28, 28, generator=generator)
    labels = torch.randint(0, 62, (rows,), generator=generator)
    data = datasets.Dataset.from_dict({"pixel_values": pixels.numpy(), "labels": labels.tolist()})
    return data.with_format("torch")


def run(k: int, options, data) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        args = FedTrainingArguments(
            output_dir=tmp, use_cpu=options.device == "cpu", bf16=options.bf16, fed_algorithm="fedavg",
            num_clients=options.num_clients, partition_scheme="iid", clients_per_round=10, num_rounds=options.rounds,
            local_epochs=1.0,
            per_device_train_batch_size=10, learning_rate=0.05, seed=0, disable_tqdm=True, eval_every_n_rounds=10**6,
            concurrent_clients=k, dataloader_pin_memory=options.device != "cpu",
        )
        torch.manual_seed(0)
        model = create_model("small_cnn", 62, in_chans=1, image_size=28, hidden_dim=2048)
        times = RoundTimes()
        trainer = FederatedTrainer(model, args, data, None, label_column="labels", callbacks=[times])
        params = trainer.train().params.detach().float().cpu()
        if not trainer.comm.is_main:  # (launched: the main process times the rounds, aggregation included)
            return {"k": k, "params": params}
        timed, cpu = times.seconds[1:], times.cpu_seconds[1:]  # round 1 builds the lanes and warms up
        lanes = trainer.local_training.concurrent.lanes if trainer.local_training.concurrent else []
        return {"k": k, "seconds_per_round": sum(timed) / len(timed), "rounds_per_second": len(timed) / sum(timed),
                "cpu_seconds_per_round": sum(cpu) / len(cpu), "round_seconds": times.seconds,
                "clients_per_lane": [len(lane.clients) for lane in lanes],
                "num_parameters": trainer.space.numel, "params": params}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ks", default="1,2,4")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--num_clients", type=int, default=100)
    parser.add_argument("--rows_per_client", type=int, default=20)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cpu", "cuda"))
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--output", default=str(Path(__file__).with_name("concurrent_clients.json")))
    group = init_process_group()  # under accelerate launch (e.g. single_gpu_4proc.yaml): one share per process
    options = parser.parse_args()
    data = femnist_like(options.num_clients * options.rows_per_client)
    results = [run(int(k), options, data) for k in options.ks.split(",")]
    if not group.is_main:
        return
    reference = results[0]["params"]
    for result in results:
        params = result.pop("params")
        result["max_abs_weight_diff"] = float((params - reference).abs().max())
        result["speedup_vs_first"] = results[0]["seconds_per_round"] / result["seconds_per_round"]
        result["vs_flute"] = FLUTE_SECONDS_PER_ROUND / result["seconds_per_round"]
        print(f"K={result['k']}: {result['seconds_per_round'] * 1000:.1f} ms/round, {result['rounds_per_second']:.2f} "
              f"rounds/s ({result['speedup_vs_first']:.2f}x K={results[0]['k']}, {result['vs_flute']:.2f}x FLUTE's "
              f"0.33 s/round), process CPU {result['cpu_seconds_per_round'] * 1000:.1f} ms/round, clients per lane "
              f"{result['clients_per_lane']}, max |w - w_K1| {result['max_abs_weight_diff']:.3g}", flush=True)
    machine = {"device": options.device, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
               "platform": platform.platform(),
               "gpu": torch.cuda.get_device_name() if options.device == "cuda" else None,
               "bf16": options.bf16, "processes": group.world_size}
    Path(options.output).write_text(json.dumps({"machine": machine, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
