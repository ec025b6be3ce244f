"""Tiny transformers text models federated through ``hf-fedflat train``: do they learn, and at what cost per round?

    python benchmarks/text_models.py [--quick] [--rounds 10] [--repeats 5] [--threads 1] [--tasks bert,llama]
                                     [--output benchmarks/text_models.json]

Two tasks, each with FedAvg and FedLESAM, ``--rounds`` rounds, evaluation every round, all offline
(:mod:`hf_fedflat.data.tiny_text` writes the models, tokenizers and data):

* a tiny BERT (hidden 32, 2 layers, word-level vocabulary of ~90) classifying short reviews (``neg``/``pos``)
  from a ``save_to_disk`` copy with 10% of the labels flipped (a ceiling near 90%), one client per user (``--partition_by user_id``): accuracy per round against
  chance (the test split's majority share);
* a tiny Llama (hidden 32, 2 layers) tuned on Alpaca-format instructions (loss on the response), 10 IID clients:
  perplexity per round against the unigram perplexity of the response tokens (token frequencies of the training
  responses, add-one smoothed, scored on the evaluation responses; a uniform guess scores the vocabulary size).

The federated side is ``hf-fedflat train``'s own path (its flags parsed by ``parse_train_args``, built and run by
``run_experiment``, so the same data, model, collator and metrics). Cost: FedAvg / a plain PyTorch loop doing the
same work, and FedLESAM / FedAvg, measured as ``benchmarks/run.py`` and ``benchmarks/workloads.py`` measure: the
sides in lock-step round by round (``run.py``'s :class:`LockStep` through ``lock_step_repeats``), each round's
fastest time over ``--repeats`` repeats, round 0 a warm-up, ``ratio_record``'s JSON records. The plain loop does
the same optimizer steps: the same sampled clients, each client's batches in the Trainer's order
(``workloads.client_order``: accelerate's seedable sampler, seed ``derive_seed(seed, round, client)``), torch seeded
as the library seeds a client (dropout), AdamW (weight decay 0) made afresh per client, gradient clipping at 1.0,
the causal-LM loss over the batch's label tokens (``num_items_in_batch``, as the Trainer passes it), the
size-weighted average of the deltas and the same evaluation every round (inside the timed round on both sides).
Its final weights are compared with FedAvg's (``max_abs_weight_diff``). The load average is recorded.

``--quick``: 3 rounds, 1 repeat, a check that it runs (writes ``--output`` only when given).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)
import run as bench  # noqa: E402
from run import BeforeRound, RoundClock, RoundGate, RunTiming, load_average, load_flat, log, no_gate  # noqa: E402
from workloads import Job, client_order  # noqa: E402

COMMON = ["--clients_per_round", "5", "--local_steps", "5", "--per_device_train_batch_size", "16",
          "--optim", "adamw_torch", "--max_grad_norm", "1.0", "--use_cpu", "true", "--seed", "0",
          "--eval_every_n_rounds", "1", "--save_every_n_rounds", "0", "--disable_tqdm", "true",
          "--report_to", "none"]
TASKS = {
    "bert": {"arch": "bert", "lr": "0.003", "extra": ["--partition_by", "user_id"]},
    "llama": {"arch": "llama", "lr": "0.01", "extra": ["--num_clients", "10", "--partition_scheme", "iid",
                                                      "--max_seq_length", "96", "--test_fraction", "0.2"]},
}
METRIC = {"bert": "eval_accuracy", "llama": "eval_perplexity"}


def write_assets(root: str) -> dict[str, str]:
    from hf_fedflat.data.tiny_text import write_instruction_data, write_sentiment_data, write_tiny_model

    return {"bert_model": write_tiny_model(os.path.join(root, "bert"), "bert"),
            "llama_model": write_tiny_model(os.path.join(root, "llama"), "llama"),
            "bert_data": write_sentiment_data(os.path.join(root, "reviews"), train_rows=600, test_rows=200,
                                              num_users=10, label_noise=0.1),
            "llama_data": write_instruction_data(os.path.join(root, "alpaca"), rows=800)}


def train_argv(task: str, algorithm: str, assets: dict, rounds: int, out: str) -> list[str]:
    """``hf-fedflat train``'s flags for ``task`` (what ``hf-fedflat train ...`` would be given)."""
    spec = TASKS[task]
    return ["--model_name_or_path", assets[f"{task}_model"], "--dataset_name", assets[f"{task}_data"],
            "--fed_algorithm", algorithm, "--num_rounds", str(rounds), "--learning_rate", spec["lr"],
            "--output_dir", out, *COMMON, *spec["extra"]]


def run_federated(task: str, algorithm: str, assets: dict, rounds: int, before_round: RoundGate = no_gate) -> RunTiming:
    """``hf-fedflat train``'s run (``parse_train_args`` + ``run_experiment``), timed per round by ``RoundClock``."""
    from hf_fedflat.cli import parse_train_args
    from hf_fedflat.cli.experiment import run_experiment

    timing = RunTiming(algorithm)
    with tempfile.TemporaryDirectory(prefix=f"hf_fedflat_text_{task}_{algorithm}_") as out:
        data_args, model_args, lora_args, args = parse_train_args(train_argv(task, algorithm, assets, rounds, out))
        experiment, output = run_experiment(data_args, model_args, args, lora_args=lora_args,
                                            callbacks=[BeforeRound(before_round), RoundClock(timing)])
        with open(os.path.join(out, "history.json")) as f:
            history = json.load(f)
    timing.final_params = output.params.detach().clone()
    timing.gradient_passes = experiment.trainer.client_trainer.gradient_passes
    timing.extra["per_round"] = [round(r[METRIC[task]], 4) for r in history]
    timing.extra["history_round_seconds"] = [round(r["round_seconds"], 5) for r in history]
    return timing


def evaluate(task: str, model, eval_loader) -> float:
    """Accuracy (BERT) or perplexity over the response tokens (Llama) of the evaluation split."""
    from hf_fedflat.metrics.language_modeling import token_statistics

    model.eval()
    stats = []
    with torch.no_grad():
        for inputs in eval_loader:
            out = model(**inputs)
            if task == "bert":
                stats.append(((out.logits.argmax(-1) == inputs["labels"]).sum().item(), len(inputs["labels"])))
            else:
                stats.append(tuple(token_statistics(out.logits, inputs["labels"]).sum(0).tolist()))
    model.train()
    if task == "bert":
        return sum(s[0] for s in stats) / sum(s[1] for s in stats)
    return math.exp(sum(s[0] for s in stats) / sum(s[1] for s in stats))


def run_plain(task: str, assets: dict, rounds: int, before_round: RoundGate = no_gate) -> RunTiming:
    """FedAvg's rounds done with torch alone (the same data, model and collator, from ``build_experiment``)."""
    from torch.utils.data import DataLoader
    from transformers import set_seed

    from hf_fedflat.cli import parse_train_args
    from hf_fedflat.cli.experiment import build_experiment
    from hf_fedflat.sampling import derive_seed, sample_clients

    with tempfile.TemporaryDirectory(prefix=f"hf_fedflat_text_{task}_plain_") as out:
        data_args, model_args, _, args = parse_train_args(train_argv(task, "fedavg", assets, rounds, out))
        experiment = build_experiment(data_args, model_args, args)  # its model: the run's initial weights
    args, data, model, partition = experiment.args, experiment.data, experiment.model, experiment.trainer.partition
    del experiment
    job = Job(num_rounds=rounds, num_clients=args.num_clients, clients_per_round=args.clients_per_round,
              batch_size=args.per_device_train_batch_size, learning_rate=args.learning_rate,
              local_steps=args.local_steps, max_grad_norm=args.max_grad_norm, seed=args.seed)
    collate = data.data_collator
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    global_params = torch.nn.utils.parameters_to_vector(params).detach().clone()
    sizes = torch.tensor([int(n) for n in partition.num_samples], dtype=torch.float64)
    client_rows: dict[int, object] = {}  # each client's rows, selected at its first round (as the trainer does)
    eval_loader = DataLoader(data.eval, batch_size=args.per_device_eval_batch_size, collate_fn=collate)
    timing = RunTiming("plain_loop")
    per_round = []
    for round_index in range(job.num_rounds):
        before_round(round_index)
        start, cpu_start = time.perf_counter(), time.process_time()
        clients = sample_clients(job.num_clients, job.clients_per_round, job.seed, round_index)
        weights = (sizes[clients] / sizes[clients].sum()).tolist()
        total = torch.zeros_like(global_params)
        steps = 0
        for client_id, weight in zip(clients, weights):
            if client_id not in client_rows:
                client_rows[client_id] = data.train.select(partition.client_indices[client_id].tolist())
            rows = client_rows[client_id]
            load_flat(params, global_params)
            set_seed(derive_seed(job.seed, round_index, client_id))  # dropout, as the library seeds a client
            optimizer = torch.optim.AdamW(params, lr=job.learning_rate, weight_decay=0.0)
            per_epoch = -(-len(rows) // job.batch_size)
            for step, batch in enumerate(client_order(job, round_index, client_id, len(rows))):
                if step % per_epoch == 0:  # the draw a DataLoader's iterator takes from torch's RNG (its base seed)
                    torch.empty((), dtype=torch.int64).random_()
                inputs = collate([rows[i] for i in batch.tolist()])
                extra = {}
                if task == "llama":  # the Trainer's loss: summed over the batch's label tokens / their count
                    extra["num_items_in_batch"] = inputs["labels"][..., 1:].ne(-100).sum()
                loss = model(**inputs, **extra).loss
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, job.max_grad_norm)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                steps += 1
            total.add_(torch.nn.utils.parameters_to_vector(params).detach() - global_params, alpha=weight)
        global_params = global_params + total
        load_flat(params, global_params)
        per_round.append(round(evaluate(task, model, eval_loader), 4))
        timing.round_seconds.append(time.perf_counter() - start)
        timing.round_cpu_seconds.append(time.process_time() - cpu_start)
        timing.round_steps.append(steps)
    timing.final_params = global_params
    timing.gradient_passes = sum(timing.round_steps)
    timing.extra["per_round"] = per_round
    return timing


def load_prepared(task: str, assets: dict):
    """The tokenized data as the run prepares them (same loader, same seed)."""
    from hf_fedflat.data.arguments import DataArguments
    from hf_fedflat.data.catalog import load_data
    from hf_fedflat.models.arguments import ModelArguments

    spec = TASKS[task]
    extra = dict(zip(spec["extra"][::2], spec["extra"][1::2]))
    data_args = DataArguments(dataset_name=assets[f"{task}_data"], partition_by=extra.get("--partition_by"),
                              max_seq_length=int(extra.get("--max_seq_length", 256)),
                              test_fraction=float(extra.get("--test_fraction", 0.2)))
    return load_data(data_args, ModelArguments(model_name_or_path=assets[f"{task}_model"]), 0)


def unigram_perplexity(assets: dict) -> float:
    """exp(mean -log p(token)) of the evaluation responses under the training responses' add-one unigram."""
    data = load_prepared("llama", assets)
    train_tokens = Counter(t for row in data.train["labels"] for t in row if t != -100)
    vocab = data.num_classes
    total = sum(train_tokens.values()) + vocab
    logp = [math.log((train_tokens[t] + 1) / total) for row in data.eval["labels"] for t in row[1:] if t != -100]
    return math.exp(-float(np.mean(logp)))


def compare_task(task: str, assets: dict, rounds: int, repeats: int) -> tuple[dict, list[dict]]:
    """FedAvg vs the plain loop and FedLESAM vs FedAvg on ``task``, in lock-step; (per-task entries, records)."""
    runners = {"plain_loop": lambda gate: run_plain(task, assets, rounds, gate),
               "fedavg": lambda gate: run_federated(task, "fedavg", assets, rounds, gate),
               "fedlesam": lambda gate: run_federated(task, "fedlesam", assets, rounds, gate)}
    load_before = load_average()
    best = bench.lock_step_repeats(runners, repeats, task)
    runs = best.pop("_runs")
    env = {"load_avg_before": load_before, "load_avg_after": load_average(), "torch_threads": torch.get_num_threads(),
           "rounds": rounds, "metric": METRIC[task]}
    records = [bench.ratio_record(f"text_{task}_fedavg_vs_plain_loop", 1.10, False, "FedAvg / plain loop",
                                  best["fedavg"], best["plain_loop"], runs, same_math=True, extra=env),
               bench.ratio_record(f"text_{task}_fedlesam_vs_fedavg", 1.10, False, "FedLESAM / FedAvg",
                                  best["fedlesam"], best["fedavg"], runs, same_math=False, extra=env)]
    fedavg, plain = records[0], records[1]
    entries = {
        f"{task}/fedavg": {"per_round": best["fedavg"].extra["per_round"],
                           "plain_loop_per_round": best["plain_loop"].extra["per_round"],
                           "ratio_vs_plain_loop": fedavg["ratio"],
                           "ratio_vs_plain_loop_second_half": fedavg["details"]["ratio_second_half"],
                           "max_abs_weight_diff": fedavg["details"]["max_abs_weight_diff"],
                           "seconds_per_round": best["fedavg"].seconds_per_round,
                           "plain_loop_seconds_per_round": best["plain_loop"].seconds_per_round},
        f"{task}/fedlesam": {"per_round": best["fedlesam"].extra["per_round"],
                             "ratio_vs_fedavg": plain["ratio"],
                             "seconds_per_round": best["fedlesam"].seconds_per_round},
    }
    return entries, records


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds, 1 repeat: a check that it runs.")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per run (default 10; --quick 3)")
    parser.add_argument("--repeats", type=int, default=None, help="lock-step repeats (default 5; --quick 1)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tasks", default="bert,llama", help="comma-separated: bert, llama")
    parser.add_argument("--output", default=None, help="JSON results (default benchmarks/text_models.json; "
                                                       "--quick: none unless given)")
    options = parser.parse_args(argv)
    rounds = options.rounds or (3 if options.quick else 10)
    repeats = options.repeats or (1 if options.quick else 5)
    output = options.output or (None if options.quick else os.path.join(HERE, "text_models.json"))
    torch.set_num_threads(options.threads)
    from hf_fedflat.federation.comm import init_federated_process_group

    init_federated_process_group()
    root = tempfile.mkdtemp(prefix="hf_fedflat_text_bench_")
    results: dict = {"rounds": rounds, "repeats": repeats, "threads": options.threads, "quick": options.quick,
                     "load_avg_start": load_average(), "tasks": {}, "records": []}
    t0 = time.perf_counter()
    try:
        assets = write_assets(root)
        test_labels = load_prepared("bert", assets).eval["labels"]
        results["chance_accuracy"] = max(Counter(test_labels).values()) / len(test_labels)
        results["unigram_perplexity"] = unigram_perplexity(assets)
        results["uniform_perplexity"] = load_prepared("llama", assets).num_classes
        for task in [t.strip() for t in options.tasks.split(",") if t.strip()]:
            entries, records = compare_task(task, assets, rounds, repeats)
            results["tasks"].update(entries)
            results["records"] += records
            key = METRIC[task]
            avg, lesam = entries[f"{task}/fedavg"], entries[f"{task}/fedlesam"]
            print(f"{task}/fedavg: {key} per round {avg['per_round']}; plain loop {avg['plain_loop_per_round']}; "
                  f"{avg['seconds_per_round']:.3f} vs plain loop {avg['plain_loop_seconds_per_round']:.3f} s/round "
                  f"(ratio {avg['ratio_vs_plain_loop']:.3f}, later half {avg['ratio_vs_plain_loop_second_half']:.3f}); "
                  f"max |dw| {avg['max_abs_weight_diff']:.2e}", flush=True)
            print(f"{task}/fedlesam: {key} per round {lesam['per_round']}; {lesam['seconds_per_round']:.3f} s/round "
                  f"(ratio to FedAvg {lesam['ratio_vs_fedavg']:.3f}); load {records[0]['details']['load_avg_before']}"
                  f" -> {records[0]['details']['load_avg_after']}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    results["load_avg_end"] = load_average()
    results["seconds"] = round(time.perf_counter() - t0, 1)
    print(f"chance accuracy {results['chance_accuracy']:.3f}; unigram perplexity {results['unigram_perplexity']:.2f}; "
          f"load average {results['load_avg_start']} -> {results['load_avg_end']}")
    if output:
        with open(output, "w") as f:
            json.dump(results, f, indent=1, default=str)
            f.write("\n")
    return results


if __name__ == "__main__":
    main()
