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

import logging
import os
import sys
from dataclasses import dataclass, field

from transformers import HfArgumentParser

from hf_fedflat import FedTrainingArguments, init_process_group
from hf_fedflat.comparison import format_markdown, run_comparison, write_comparison
from hf_fedflat.data import load_digits_dataset
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


def main(argv: list[str] | None = None) -> list[dict]:
    group = init_process_group()  # first: before the arguments set up accelerate
    argv = sys.argv[1:] if argv is None else argv
    quick, args, single = parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    data = load_digits_dataset(image_size=quick.image_size, seed=args.seed)
    names = [args.fed_algorithm] if single else [n.strip() for n in quick.compare.split(",") if n.strip()]
    rows, histories = run_comparison(
        args, names, lambda: create_model(quick.model_name, num_classes=10, in_chans=1, image_size=quick.image_size),
        data["train"], data["test"], single_run=single,
    )
    if group.is_main:
        table = format_markdown(rows)
        print("\n" + table)
        if not single:
            write_comparison(rows, histories, args.output_dir)
    return rows


if __name__ == "__main__":
    main()
