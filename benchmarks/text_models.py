"""Tiny transformers text models federated through ``hf-fedflat train``: do they learn, and at what cost per round?

    python benchmarks/text_models.py [--rounds 10] [--threads 1] [--output benchmarks/text_models.json]

Two tasks, each with FedAvg and FedLESAM, ``--rounds`` rounds, evaluation every round, all offline
(:mod:`hf_fedflat.data.text` writes the models, tokenizers and data):

* a tiny BERT (hidden 32, 2 layers, word-level vocabulary of ~90) classifying short reviews (``neg``/``pos``)
  from a ``save_to_disk`` copy with 10% of the labels flipped (a ceiling near 90%), one client per user (``--partition_by user_id``): accuracy per round against
  chance (the test split's majority share);
* a tiny Llama (hidden 32, 2 layers) tuned on Alpaca-format instructions (loss on the response), 10 IID clients:
  perplexity per round against the unigram perplexity of the response tokens (token frequencies of the training
  responses, add-one smoothed, scored on the evaluation responses; a uniform guess scores the vocabulary size).

Cost: seconds per round of ``hf-fedflat train`` (history ``round_seconds``) / seconds per round of a plain PyTorch
loop doing the same work -- the same sampled clients (read from the run's history), the same number of AdamW steps
of the same batch size on each client's rows with the same collator, gradient clipping, the size-weighted average
and the same evaluation every round. Median and min over the rounds of both (on a shared machine the min is the
least disturbed round); the ratios are printed with the raw numbers and written to ``--output``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections import Counter

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

COMMON = ["--clients_per_round", "5", "--local_steps", "5", "--per_device_train_batch_size", "16",
          "--optim", "adamw_torch", "--max_grad_norm", "1.0", "--use_cpu", "true", "--seed", "0",
          "--eval_every_n_rounds", "1", "--save_every_n_rounds", "0", "--disable_tqdm", "true"]
TASKS = {
    "bert": {"arch": "bert", "lr": "0.003", "extra": ["--partition_by", "user_id"]},
    "llama": {"arch": "llama", "lr": "0.01", "extra": ["--num_clients", "10", "--partition_scheme", "iid",
                                                      "--max_seq_length", "96", "--test_fraction", "0.2"]},
}
ALGORITHMS = ("fedavg", "fedlesam")


def write_assets(root: str) -> dict[str, str]:
    from hf_fedflat.data.text import write_instruction_data, write_sentiment_data, write_tiny_model

    return {"bert_model": write_tiny_model(os.path.join(root, "bert"), "bert"),
            "llama_model": write_tiny_model(os.path.join(root, "llama"), "llama"),
            "bert_data": write_sentiment_data(os.path.join(root, "reviews"), train_rows=600, test_rows=200,
                                              num_users=10, label_noise=0.1),
            "llama_data": write_instruction_data(os.path.join(root, "alpaca"), rows=800)}


def run_federated(task: str, algorithm: str, assets: dict, rounds: int, out: str) -> list[dict]:
    from hf_fedflat.cli import main

    spec = TASKS[task]
    argv = ["train", "--model_name_or_path", assets[f"{task}_model"], "--dataset_name", assets[f"{task}_data"],
            "--fed_algorithm", algorithm, "--num_rounds", str(rounds), "--learning_rate", spec["lr"],
            "--output_dir", out, *COMMON, *spec["extra"]]
    if main(argv) != 0:
        raise RuntimeError(f"{task}/{algorithm} failed")
    with open(os.path.join(out, "history.json")) as f:
        return json.load(f)


def load_prepared(task: str, assets: dict):
    """The tokenized data, collator and metrics exactly as the run prepared them (same loader, same seed)."""
    from hf_fedflat.data.arguments import DataArguments
    from hf_fedflat.data.catalog import load_data
    from hf_fedflat.models.arguments import ModelArguments

    spec = TASKS[task]
    extra = dict(zip(spec["extra"][::2], spec["extra"][1::2]))
    data_args = DataArguments(dataset_name=assets[f"{task}_data"], partition_by=extra.get("--partition_by"),
                              max_seq_length=int(extra.get("--max_seq_length", 256)),
                              test_fraction=float(extra.get("--test_fraction", 0.2)))
    return load_data(data_args, ModelArguments(model_name_or_path=assets[f"{task}_model"]), 0)


def plain_loop(task: str, assets: dict, history: list[dict], partition_json: str) -> tuple[list[float], list[dict]]:
    """The same rounds as ``history`` (its clients), done with torch alone; ``(seconds of each round, metrics)``."""
    import transformers
    from torch.utils.data import DataLoader

    from hf_fedflat.data.partition import ClientPartition

    data = load_prepared(task, assets)
    partition = ClientPartition.load_json(partition_json)
    spec = TASKS[task]
    cls = transformers.AutoModelForSequenceClassification if task == "bert" else transformers.AutoModelForCausalLM
    torch.manual_seed(0)
    model = cls.from_pretrained(assets[f"{task}_model"], **({"num_labels": 2} if task == "bert" else {}))
    lr, steps, batch = float(spec["lr"]), 5, 16
    collate = data.data_collator
    clients = [data.train.select(idx.tolist()) for idx in partition.client_indices]
    eval_loader = DataLoader(data.eval, batch_size=128, collate_fn=collate)
    metrics, seconds = [], []
    for record in history:
        start = time.perf_counter()
        global_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        total, weight_sum = None, 0
        for cid in record["clients"]:
            model.load_state_dict(global_state)
            model.train()
            optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
            loader = DataLoader(clients[cid], batch_size=batch, shuffle=True, collate_fn=collate)
            done = 0
            while done < steps:
                for inputs in loader:
                    loss = model(**inputs).loss
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    optimizer.step()
                    optimizer.zero_grad()
                    done += 1
                    if done == steps:
                        break
            n = len(clients[cid])
            state = model.state_dict()
            total = {k: v.detach().float() * n for k, v in state.items()} if total is None else \
                {k: total[k] + state[k].detach().float() * n for k in total}
            weight_sum += n
        model.load_state_dict({k: (v / weight_sum).to(global_state[k].dtype) for k, v in total.items()})
        model.eval()
        stats = []
        with torch.no_grad():
            for inputs in eval_loader:
                out = model(**inputs)
                if task == "bert":
                    stats.append(((out.logits.argmax(-1) == inputs["labels"]).sum().item(), len(inputs["labels"])))
                else:
                    from hf_fedflat.metrics.language_modeling import token_statistics

                    stats.append(tuple(token_statistics(out.logits, inputs["labels"]).sum(0).tolist()))
        seconds.append(time.perf_counter() - start)
        if task == "bert":
            metrics.append({"accuracy": sum(s[0] for s in stats) / sum(s[1] for s in stats)})
        else:
            nll, count = sum(s[0] for s in stats), sum(s[1] for s in stats)
            metrics.append({"perplexity": math.exp(nll / count)})
    return seconds, metrics


def unigram_perplexity(assets: dict) -> float:
    """exp(mean -log p(token)) of the evaluation responses under the training responses' add-one unigram."""
    data = load_prepared("llama", assets)
    train_tokens = Counter(t for row in data.train["labels"] for t in row if t != -100)
    vocab = data.num_classes
    total = sum(train_tokens.values()) + vocab
    logp = [math.log((train_tokens[t] + 1) / total) for row in data.eval["labels"] for t in row[1:] if t != -100]
    return math.exp(-float(np.mean(logp)))


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tasks", default="bert,llama", help="comma-separated: bert, llama")
    parser.add_argument("--output", default=os.path.join(ROOT, "benchmarks", "text_models.json"))
    options = parser.parse_args(argv)
    torch.set_num_threads(options.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    root = tempfile.mkdtemp(prefix="hf_fedflat_text_bench_")
    results: dict = {"rounds": options.rounds, "threads": options.threads, "tasks": {}}
    try:
        assets = write_assets(root)
        test_labels = load_prepared("bert", assets).eval["labels"]
        results["chance_accuracy"] = max(Counter(test_labels).values()) / len(test_labels)
        results["unigram_perplexity"] = unigram_perplexity(assets)
        results["uniform_perplexity"] = load_prepared("llama", assets).num_classes
        for task in [t.strip() for t in options.tasks.split(",") if t.strip()]:
            for algorithm in ALGORITHMS:
                out = os.path.join(root, f"{task}_{algorithm}")
                history = run_federated(task, algorithm, assets, options.rounds, out)
                key = "eval_accuracy" if task == "bert" else "eval_perplexity"
                seconds = [r["round_seconds"] for r in history]
                entry = {"per_round": [round(r[key], 4) for r in history], "round_seconds": seconds,
                         "seconds_per_round": float(np.median(seconds)), "min_round_seconds": float(min(seconds))}
                if algorithm == "fedavg":
                    plain, plain_metrics = plain_loop(task, assets, history, os.path.join(out, "partition.json"))
                    entry["plain_loop_round_seconds"] = plain
                    entry["plain_loop_seconds_per_round"] = float(np.median(plain))
                    entry["plain_loop_per_round"] = [round(next(iter(m.values())), 4) for m in plain_metrics]
                    # median and min over the rounds: the machine is shared, the min is the least disturbed round
                    entry["ratio_vs_plain_loop"] = entry["seconds_per_round"] / entry["plain_loop_seconds_per_round"]
                    entry["min_ratio_vs_plain_loop"] = entry["min_round_seconds"] / float(min(plain))
                results["tasks"][f"{task}/{algorithm}"] = entry
                print(f"{task}/{algorithm}: {key} per round {entry['per_round']}; "
                      f"median {entry['seconds_per_round']:.3f} s/round"
                      + (f" vs plain loop {entry['plain_loop_seconds_per_round']:.3f} s/round "
                         f"(median ratio {entry['ratio_vs_plain_loop']:.2f}, min-round ratio "
                         f"{entry['min_ratio_vs_plain_loop']:.2f})" if "plain_loop_seconds_per_round" in entry
                         else ""), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"chance accuracy {results['chance_accuracy']:.3f}; unigram perplexity {results['unigram_perplexity']:.2f}")
    with open(options.output, "w") as f:
        json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main()
