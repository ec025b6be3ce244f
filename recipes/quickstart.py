"""The embedded default: federated training on scikit-learn's real handwritten digits, offline.

    accelerate launch recipes/quickstart.py                       # FedAvg vs FedSAM vs SCAFFOLD table
    accelerate launch recipes/quickstart.py --fed_algorithm fedgamma --num_rounds 50
    accelerate launch --config_file accelerate_configs/cpu_2proc.yaml recipes/quickstart.py

1,797 8x8 digits (they ship inside scikit-learn) are upscaled to the model's input, split 80/20,
and the training part is partitioned over 20 clients with Dir(0.3) label skew. Every
``FedTrainingArguments`` field works as a flag (``--num_rounds``, ``--seed``, ``--rho``, ...); a lone
``.yaml``/``.json`` argument is read as a config file.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
from dataclasses import dataclass, field

from transformers import HfArgumentParser, set_seed

from hf_fedflat import FedTrainingArguments, FederatedTrainer
from hf_fedflat.data import load_digits_dataset
from hf_fedflat.federation import get_process_group
from hf_fedflat.models import create_model

logger = logging.getLogger("quickstart")

# Recipe defaults; any flag given on the command line wins (argparse keeps the last value).
DEFAULTS = [
    "--output_dir", "outputs/quickstart", "--num_clients", "20", "--clients_per_round", "10",
    "--num_rounds", "30", "--local_epochs", "1", "--learning_rate", "0.05", "--per_device_train_batch_size", "16",
    "--partition_scheme", "dirichlet", "--dirichlet_alpha", "0.3", "--seed", "42", "--eval_every_n_rounds", "1",
]


@dataclass
class QuickstartArguments:
    compare: str = field(
        default="fedavg,fedsam,scaffold",
        metadata={"help": "Algorithms compared when --fed_algorithm is not given (one sub-folder of output_dir each)."},
    )
    model_name: str = field(default="small_cnn", metadata={"help": "Model factory name (hf_fedflat.models)."})
    image_size: int = field(default=16, metadata={"help": "Side the 8x8 digits are upscaled to."})


def parse(argv: list[str]) -> tuple[QuickstartArguments, FedTrainingArguments, bool]:
    parser = HfArgumentParser((QuickstartArguments, FedTrainingArguments))
    if len(argv) == 1 and argv[0].endswith((".yaml", ".yml", ".json")):
        loader = parser.parse_yaml_file if argv[0].endswith(("yaml", "yml")) else parser.parse_json_file
        quick, args = loader(os.path.abspath(argv[0]))
        single = True
    else:
        quick, args = parser.parse_args_into_dataclasses(DEFAULTS + argv)
        single = any(a == "--fed_algorithm" or a.startswith("--fed_algorithm=") for a in argv)
    return quick, args, single


def run_one(quick: QuickstartArguments, args: FedTrainingArguments, data) -> dict:
    set_seed(args.seed)  # same initial model for every algorithm
    model = create_model(quick.model_name, num_classes=10, in_chans=1, image_size=quick.image_size)
    start = time.perf_counter()
    output = FederatedTrainer(model, args, data["train"], data["test"]).train()
    seconds = time.perf_counter() - start
    accuracies = [r["eval_accuracy"] for r in output.history if "eval_accuracy" in r]
    return {
        "algorithm": args.fed_algorithm,
        "final_accuracy": accuracies[-1] if accuracies else float("nan"),
        "best_accuracy": max(accuracies) if accuracies else float("nan"),
        "seconds_per_round": seconds / max(1, len(output.history)),
    }


def format_table(rows: list[dict]) -> str:
    base = next((r["seconds_per_round"] for r in rows if r["algorithm"] == "fedavg"), rows[0]["seconds_per_round"])
    lines = ["| algorithm | final acc | best acc | s/round | time vs fedavg |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['algorithm']} | {r['final_accuracy']:.4f} | {r['best_accuracy']:.4f} | "
                     f"{r['seconds_per_round']:.2f} | {r['seconds_per_round'] / base:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    quick, args, single = parse(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    data = load_digits_dataset(image_size=quick.image_size, seed=args.seed)
    if single:
        rows = [run_one(quick, args, data)]
    else:
        rows = []
        for name in [n.strip() for n in quick.compare.split(",") if n.strip()]:
            # rho=None: each preset's own default unless the user set one
            rho = args.rho if any(a.startswith("--rho") for a in (argv or sys.argv[1:])) else None
            sub = dataclasses.replace(args, fed_algorithm=name, output_dir=os.path.join(args.output_dir, name), rho=rho)
            rows.append(run_one(quick, sub, data))
    if get_process_group().is_main:
        table = format_table(rows)
        print("\n" + table)
        os.makedirs(args.output_dir, exist_ok=True)
        with open(os.path.join(args.output_dir, "results.md"), "w") as handle:
            handle.write(table + "\n")
    return rows


if __name__ == "__main__":
    main()
