"""The embedded default: federated training on scikit-learn's real handwritten digits, offline.

    accelerate launch recipes/quickstart.py                       # FedAvg vs FedSAM vs SCAFFOLD table
    accelerate launch recipes/quickstart.py --fed_algorithm fedgamma --num_rounds 50
    accelerate launch --config_file accelerate_configs/cpu_2proc.yaml recipes/quickstart.py
    accelerate launch recipes/quickstart.py --smoke               # seconds: 4 clients, 2 rounds, FedAvg vs FedSAM

1,797 8x8 digits (they ship inside scikit-learn) are upscaled to the model's input, split 80/20,
and the training part is partitioned over 20 clients with Dir(0.3) label skew. Every
``FedTrainingArguments`` field works as a flag (``--num_rounds``, ``--seed``, ``--rho``, ...), or as a key of
``--config run.yaml`` (a lone ``.yaml``/``.json`` argument is read as one); flags win over the file, the file over
the defaults below.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from dataclasses import dataclass, field

from hf_fedflat import FedTrainingArguments, init_process_group
from hf_fedflat.cli.comparison import format_markdown, run_comparison, write_comparison
from hf_fedflat.cli.conventions import check_convention_mode
from hf_fedflat.data import load_digits_dataset
from hf_fedflat.federation.run_folder import claimed_run_folder
from hf_fedflat.data.arguments import DEFAULT_SPLIT_SEED
from hf_fedflat.models import create_model
from hf_fedflat.models.arguments import ModelArguments
from hf_fedflat.cli.parsing import explicit_fields, parse_arguments

logger = logging.getLogger("quickstart")

# Recipe defaults; a --config file and the flags given win over them.
DEFAULTS = [
    "--output_dir", "outputs/quickstart", "--num_clients", "20", "--clients_per_round", "10",
    "--num_rounds", "30", "--local_epochs", "1", "--optim", "sgd", "--learning_rate", "0.05",
    "--per_device_train_batch_size", "16",
    "--partition_scheme", "dirichlet", "--dirichlet_alpha", "0.3", "--seed", "42", "--eval_every_n_rounds", "1",
]
# --smoke: a run of seconds (offline, like everything here)
SMOKE = [
    "--compare", "fedavg,fedsam", "--num_clients", "4", "--clients_per_round", "2", "--num_rounds", "2",
    "--local_steps", "2", "--per_device_train_batch_size", "8", "--image_size", "8",
    "--output_dir", "outputs/smoke/quickstart", "--use_cpu", "true", "--disable_tqdm", "true",
    "--overwrite_output_dir", "true",  # a smoke run's folder is scratch: running it again replaces it
]


@dataclass
class QuickstartArguments:
    compare: str = field(
        default="fedavg,fedsam,scaffold",
        metadata={"help": "Algorithms compared when --fed_algorithm is not given (one sub-folder of output_dir each)."},
    )
    model_name: str = field(default="small_cnn", metadata={"help": "Model factory name (hf_fedflat.models)."})
    image_size: int = field(default=16, metadata={"help": "Side the 8x8 digits are upscaled to."})
    smoke: bool = field(default=False, metadata={"help": "A run of seconds: FedAvg vs FedSAM, 4 clients, 2 rounds."})
    conventions: str = field(
        default="aligned",
        metadata={"help": "A comparison's conventions: aligned (every convention left unset, e.g. "
                          "aggregation_weights, takes the first algorithm's value) or per_method (each preset's own)."},
    )

    def __post_init__(self):
        ModelArguments(model_name=self.model_name, image_size=self.image_size)  # train's checks of the two fields
        check_convention_mode("conventions", self.conventions)


def parse(argv: list[str]) -> tuple[QuickstartArguments, FedTrainingArguments, bool]:
    """``(quickstart options, training arguments, whether one algorithm was asked for)``."""
    quick, args = parse_arguments((QuickstartArguments, FedTrainingArguments), argv, defaults=DEFAULTS, smoke=SMOKE,
                                  prog="quickstart.py", description=__doc__)
    single = "fed_algorithm" in explicit_fields(argv)
    if single:  # (a comparison checks each algorithm's settings before the first trains)
        args.check_algorithm_settings()
    return quick, args, single


def main(argv: list[str] | None = None) -> list[dict]:
    group = init_process_group()  # first: before the arguments set up accelerate
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    quick, args, single = parse(argv)
    # one run: its folder is locked and checked before any data loads (comparisons: each sub-folder, as it starts)
    with claimed_run_folder(args, args.resume_from_checkpoint) if single else contextlib.nullcontext():
        data = load_digits_dataset(image_size=quick.image_size, seed=DEFAULT_SPLIT_SEED)  # the test set: not --seed's
        names = [args.fed_algorithm] if single else [n.strip() for n in quick.compare.split(",") if n.strip()]
        rows, histories = run_comparison(
            args, names,
            lambda: create_model(quick.model_name, num_classes=10, in_chans=1, image_size=quick.image_size),
            data["train"], data["test"], single_run=single, conventions=quick.conventions,
        )
    if group.is_main:
        table = format_markdown(rows)
        print("\n" + table)
        if not single:
            write_comparison(rows, histories, args.output_dir)
    return rows


if __name__ == "__main__":
    from hf_fedflat.cli.exit_codes import run_command_line

    run_command_line(main)
