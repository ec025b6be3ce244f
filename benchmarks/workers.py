"""Child processes of ``benchmarks/run.py``: each measures one configuration in a process of its own.

    python benchmarks/workers.py memory --algorithm scaffold --num-clients 1000 --store disk --output r.json
    accelerate launch --config_file accelerate_configs/cpu_2proc.yaml benchmarks/workers.py \\
        federated --processes-label 2 --output-dir /tmp/x --output r.json

``memory``: a federated run (round loop, client-state store, checkpoints) whose client state dominates
memory; prints and writes the process's peak resident set size (``VmHWM``, read at the end of the run,
so it covers the whole process) and what the store holds.

``federated``: the digits setting with compute-bound clients (fixed local steps), under whatever
``accelerate launch`` gave it; the main process writes the per-round wall times; the final model is
``<output-dir>/final_model/model.safetensors``.

Both set one torch thread per process (``OMP_NUM_THREADS=1`` is set by the parent as well), so that
one and two processes compare core for core.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402


def _args_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output", required=True, help="JSON file for this process's measurements.")
    parser.add_argument("--output-dir", required=True, help="The run's output_dir.")
    parser.add_argument("--seed", type=int, default=42)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    memory = sub.add_parser("memory", help="Peak RSS of a run whose client state dominates memory.")
    _args_common(memory)
    memory.add_argument("--algorithm", default="scaffold")
    memory.add_argument("--num-clients", type=int, required=True)
    memory.add_argument("--clients-per-round", type=int, default=10)
    memory.add_argument("--num-rounds", type=int, default=100)
    memory.add_argument("--store", default="disk", choices=["memory", "disk", "auto"])
    memory.add_argument("--memory-mb", type=float, default=2048.0, help="client_state_memory_mb (auto store).")
    memory.add_argument("--image-size", type=int, default=12, help="small_cnn input side (12: ~350k parameters).")
    memory.add_argument("--save-every", type=int, default=0, help="Checkpoint every n rounds (0: never).")
    federated = sub.add_parser("federated", help="Rounds/s of compute-bound clients under the current launch.")
    _args_common(federated)
    federated.add_argument("--algorithm", default="fedavg")
    federated.add_argument("--num-rounds", type=int, default=6)
    federated.add_argument("--local-steps", type=int, default=20)
    federated.add_argument("--num-clients", type=int, default=100)
    federated.add_argument("--clients-per-round", type=int, default=10)
    federated.add_argument("--image-size", type=int, default=16)
    return parser.parse_args(argv)


def _peak_rss_mb() -> float:
    """This process's peak resident set size in MiB: ``VmHWM`` of ``/proc/self/status``.

    (``getrusage(RUSAGE_SELF).ru_maxrss`` is not used: on Linux a child started by fork + exec reports at
    least its parent's peak there, which made every configuration read as the benchmark process's peak.)
    """
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux reports KiB


def run_memory(opts: argparse.Namespace) -> dict:
    """The process group first (one process here), then FedTrainingArguments, data, model, the round loop."""
    import torch

    torch.set_num_threads(1)
    import transformers

    from hf_fedflat import FedTrainingArguments, FederatedTrainer, init_process_group
    from hf_fedflat.data import load_digits_dataset
    from hf_fedflat.models import create_model

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    init_process_group()  # first: before the arguments set up accelerate
    args = FedTrainingArguments(
        output_dir=opts.output_dir, fed_algorithm=opts.algorithm, num_clients=opts.num_clients,
        clients_per_round=opts.clients_per_round, num_rounds=opts.num_rounds, local_steps=1,
        per_device_train_batch_size=2, learning_rate=0.05, partition_scheme="iid", min_partition_size=1,
        seed=opts.seed, client_state_store=opts.store, client_state_memory_mb=opts.memory_mb,
        save_every_n_rounds=opts.save_every, save_total_limit=1 if opts.save_every else None,
        eval_every_n_rounds=10**6, report_to="none", disable_tqdm=True, use_cpu=True,
    )
    data = load_digits_dataset(image_size=opts.image_size, seed=opts.seed)
    torch.manual_seed(opts.seed)
    model = create_model("small_cnn", num_classes=10, in_chans=1, image_size=opts.image_size)
    baseline = _peak_rss_mb()
    trainer = FederatedTrainer(model, args, data["train"], None)
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    store = trainer.store
    state_bytes = trainer.space.numel * 4  # one float32 vector per piece's state entry
    states = store.client_ids()
    on_disk = sum(f.stat().st_size for f in Path(args.client_state_dir or Path(opts.output_dir) / "client_states")
                  .glob("client-*.safetensors"))
    return {
        "algorithm": opts.algorithm, "num_clients": opts.num_clients, "clients_per_round": opts.clients_per_round,
        "num_rounds": opts.num_rounds, "store": opts.store, "memory_mb": opts.memory_mb,
        "num_parameters": trainer.space.numel, "clients_with_state": len(states),
        "state_mb_if_in_memory": round(len(states) * state_bytes / 2**20, 1),
        "state_mb_on_disk": round(on_disk / 2**20, 1),
        "store_memory_mb": round(getattr(getattr(store, "memory", store), "nbytes", 0) / 2**20, 1),
        "peak_rss_mb_before_trainer": round(baseline, 1), "peak_rss_mb": round(_peak_rss_mb(), 1),
        "ru_maxrss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1),
        "run_seconds": round(seconds, 2),
    }


def run_federated(opts: argparse.Namespace) -> dict | None:
    import torch

    torch.set_num_threads(1)
    import transformers

    from hf_fedflat import FedTrainingArguments, FederatedTrainer, init_process_group
    from hf_fedflat.data import load_digits_dataset
    from hf_fedflat.models import create_model

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    comm = init_process_group()  # first: before the arguments set up accelerate
    args = FedTrainingArguments(
        output_dir=opts.output_dir, fed_algorithm=opts.algorithm, num_clients=opts.num_clients,
        clients_per_round=opts.clients_per_round, num_rounds=opts.num_rounds, local_steps=opts.local_steps,
        per_device_train_batch_size=16, learning_rate=0.05, partition_scheme="dirichlet", dirichlet_alpha=0.3,
        seed=opts.seed, eval_every_n_rounds=10**6, report_to="none", disable_tqdm=True, use_cpu=True,
    )
    data = load_digits_dataset(image_size=opts.image_size, seed=opts.seed)
    torch.manual_seed(opts.seed)
    model = create_model("small_cnn", num_classes=10, in_chans=1, image_size=opts.image_size)
    trainer = FederatedTrainer(model, args, data["train"], None)
    start = time.perf_counter()
    output = trainer.train()
    seconds = time.perf_counter() - start
    if not comm.is_main:
        return None
    rounds = [r["round_seconds"] for r in output.history]
    return {
        "world_size": comm.world_size, "torch_threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "round_seconds": rounds,
        "local_steps": opts.local_steps, "clients_per_round": opts.clients_per_round,
        "train_seconds": round(seconds, 3), "final_model": str(Path(opts.output_dir) / "final_model"),
    }


def main(argv: list[str] | None = None) -> None:
    opts = parse(argv)
    result = run_memory(opts) if opts.command == "memory" else run_federated(opts)
    if result is not None:
        Path(opts.output).write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result), file=sys.stderr)


if __name__ == "__main__":
    main()
