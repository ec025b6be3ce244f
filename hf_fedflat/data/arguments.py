"""The data side of a run's configuration: which dataset (``DataArguments``) and how it is split (``PartitionArguments``).

``DataArguments`` is its own dataclass on the command line (``HfArgumentParser``); the partition fields are
part of :class:`~hf_fedflat.FedTrainingArguments` (the checkpoint fingerprint and the model card read them
there) and are declared and validated here, beside the partitioner (:mod:`hf_fedflat.data.partition`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..field_checks import ConfigError, check_choice, check_integer, check_number
from .partition import SCHEMES

__all__ = ["DEFAULT_SPLIT_SEED", "DataArguments", "PartitionArguments"]

#: the data seed when ``split_seed`` is unset: a constant, not the run's seed (transformers' default seed, so a
#: run with the default ``--seed 42`` splits the data as before ``split_seed`` existed)
DEFAULT_SPLIT_SEED = 42


@dataclass
class DataArguments:
    """Which dataset the run uses (a name of the :data:`DATASETS` registry) and how it is split."""

    dataset_name: str = field(
        default="digits",
        metadata={"help": "A registered dataset: digits (scikit-learn, offline), mnist, fashion_mnist, cifar10, cifar100, "
                          "officehome, domainnet, shakespeare, tiny_imagenet, LEAF's femnist, celeba, synthetic, sent140 and "
                          "reddit (hf_fedflat.data.catalog); or "
                          "any other dataset for a --model_name_or_path model: a Hub id (e.g. imdb, tatsu-lab/alpaca), a "
                          "save_to_disk folder, or csv/json/jsonl/parquet files (a file or a folder with train.<ext>, "
                          "test.<ext>)."},
    )
    dataset_config_name: str | None = field(
        default=None, metadata={"help": "Configuration of a Hub dataset (load_dataset's second argument)."}
    )
    train_split: str = field(default="train", metadata={"help": "Split the clients train on (Hub/local datasets)."})
    eval_split: str | None = field(
        default=None,
        metadata={"help": "Split the global model is evaluated on (Hub/local datasets; default: test, else validation, "
                          "else --test_fraction of the training split held out)."},
    )
    text_column: str | None = field(
        default=None,
        metadata={"help": "Text column (Hub/local datasets; default: text, sentence, content, review or document; "
                          "'a,b' for sentence pairs). For a causal LM, plain text trained on every token."},
    )
    max_seq_length: int = field(
        default=256, metadata={"help": "Tokens per example after truncation (padding is per batch, by the collator)."}
    )
    instruction_column: str = field(
        default="instruction", metadata={"help": "Causal LM instruction data: the instruction column (Alpaca's)."}
    )
    input_column: str | None = field(
        default="input", metadata={"help": "Causal LM instruction data: the optional input/context column."}
    )
    response_column: str = field(
        default="output", metadata={"help": "Causal LM instruction data: the response column (the loss is on it only)."}
    )
    prompt_template: str | None = field(
        default=None,
        metadata={"help": "Causal LM instruction data: a str.format template over the columns, e.g. "
                          "'Q: {instruction} {input} A: ' (newlines through a --config YAML file; default: Alpaca's, with or "
                          "without its input part)."},
    )
    max_train_samples: int | None = field(
        default=None, metadata={"help": "Keep this many training rows (a seeded sample), for quick runs."}
    )
    max_eval_samples: int | None = field(
        default=None, metadata={"help": "Keep this many evaluation rows (a seeded sample), for quick runs."}
    )
    partition_by: str | None = field(
        default=None,
        metadata={"help": "Natural-id partition: one client per value of this column (e.g. a user or speaker id; "
                          "flwr-datasets' NaturalIdPartitioner); num_clients follows the data. femnist / celeba Hub "
                          "copies: the user column (default writer_id / celeb_id)."},
    )
    dataset_path: str | None = field(
        default=None,
        metadata={"help": "Hub dataset name to load instead of the dataset's default Hub copy (e.g. uoft-cs/cifar100)."},
    )
    data_dir: str | None = field(
        default=None,
        metadata={"help": "Local copy of the data, used instead of the Hub: an image folder (<split>/<class>/<image>, or "
                          "<domain>/<class>/<image> for officehome/domainnet), a save_to_disk folder, for shakespeare "
                          "the folder of Gutenberg plays (*_gut.txt), for the LEAF datasets (femnist, celeba, synthetic, sent140, "
                          "reddit) LEAF's folder holding train/*.json and test/*.json (data/<dataset>/data; celeba: its "
                          "images in raw/img_align_celeba), for tiny_imagenet the tiny-imagenet-200 folder (wnids.txt, "
                          "words.txt, train/<wnid>/images, val/images + val/val_annotations.txt)."},
    )
    test_fraction: float = field(
        default=0.2, metadata={"help": "Share of the data held out for evaluation, for datasets without a test split."}
    )
    split_seed: int | None = field(
        default=None,
        metadata={"help": "Seed of the data itself: the train/test split (--test_fraction), the smoke subsets, the "
                          "max_clients / max_*_samples draws and the within-domain client split. Default: "
                          "DEFAULT_SPLIT_SEED (42), whatever --seed is, so runs with different seeds are scored on the "
                          "same test set (the run's --seed varies the training only)."},
    )
    held_out_domain: str | None = field(
        default=None, metadata={"help": "officehome/domainnet: the domain used as test set (leave-one-domain-out)."}
    )
    clients_per_domain: int = field(
        default=1, metadata={"help": "officehome/domainnet: clients each training domain is split into (FedLESAM: 1 or 10)."}
    )
    image_column: str | None = field(default=None, metadata={"help": "Image column of a Hub/saved copy (default: detected)."})
    label_column: str | None = field(default=None, metadata={"help": "Label column of a Hub/saved copy (default: label)."})
    domain_column: str = field(default="domain", metadata={"help": "officehome/domainnet: domain column of a Hub/saved copy."})
    train_augmentation: bool = field(
        default=False, metadata={"help": "Random crop (4-pixel padding) + horizontal flip on the training split."}
    )
    max_clients: int | None = field(
        default=None, metadata={"help": "shakespeare, sent140, reddit, femnist, celeba, synthetic (LEAF folder): keep at "
                                        "most this many clients (a seeded draw)."})
    synthetic_alpha: float = field(
        default=1.0,
        metadata={"help": "synthetic: alpha of Synthetic(alpha, beta) (FedProx): how much the clients' models differ "
                          "(u_k ~ N(0, alpha)); the paper's settings are 0, 0.5, 1."},
    )
    synthetic_beta: float = field(
        default=1.0,
        metadata={"help": "synthetic: beta of Synthetic(alpha, beta): how much the clients' inputs differ "
                          "(B_k ~ N(0, beta))."},
    )
    synthetic_num_users: int = field(default=30, metadata={"help": "synthetic: number of clients generated (FedProx: 30)."})
    synthetic_iid: bool = field(
        default=False, metadata={"help": "synthetic: Synthetic-IID (one model W, b for all clients, inputs ~ N(0, Sigma))."}
    )
    max_samples_per_client: int | None = field(
        default=None, metadata={"help": "shakespeare: keep at most this many training windows per client."}
    )
    smoke_dir: str | None = field(default=None, metadata={"help": "Where --smoke writes its data (default <output_dir>/smoke_data)."})
    smoke: bool = field(
        default=False,
        metadata={"help": "Generate a tiny local copy of the dataset in its real on-disk format (under "
                          "<output_dir>/smoke_data) and use it: a run of seconds, offline."},
    )
    drop_invalid_rows: bool = field(
        default=False,
        metadata={"help": "Drop the rows whose labels or inputs do not fit the model (a label < 0 other than -100 or "
                          ">= num_labels, every label -100, a NaN/Inf input; hf_fedflat.data.input_checks) instead of "
                          "refusing the run; the counts are logged and recorded in data_validation.json."},
    )
    metrics: str | None = field(
        default=None,
        metadata={"help": "Evaluation metrics, comma-separated; unset: the task's default. Classification: accuracy "
                          "(default), f1, precision, recall (each reported as <name>_macro and <name>_micro), matthews "
                          "(scikit-learn). Token classification: f1, precision, recall (entity level, seqeval) and "
                          "accuracy (per token); default all four. Causal LM: perplexity, token_loss, token_accuracy; "
                          "default all three. Each is eval_<key> in history.json and report_to "
                          "(hf_fedflat.metrics.selection)."},
    )
    generation_prompts: list[str] | None = field(
        default=None,
        metadata={"help": "Causal LM: prompts the global model continues greedily at each evaluation, e.g. "
                          "--generation_prompts 'Once upon a time' 'The answer is'; recorded under 'generations' in "
                          "history.json (and TensorBoard text). Off by default."},
    )
    generation_prompts_file: str | None = field(
        default=None, metadata={"help": "Causal LM: a text file of generation prompts, one per line (added to "
                                        "--generation_prompts)."})
    generation_max_new_tokens: int = field(
        default=32, metadata={"help": "Causal LM: most tokens generated per prompt (greedy)."})
    label_all_tokens: bool = field(
        default=False,
        metadata={"help": "Token classification: label every sub-token of a word (the continuation sub-tokens of a "
                          "B- word get its I- tag) instead of its first sub-token only (the rest -100)."},
    )

    def __post_init__(self):
        if not 0.0 < float(self.test_fraction) < 1.0:
            raise ConfigError(f"test_fraction: must be in (0, 1), got {self.test_fraction}.")
        if not isinstance(self.clients_per_domain, int) or self.clients_per_domain < 1:
            raise ConfigError(f"clients_per_domain: must be an integer >= 1, got {self.clients_per_domain!r}.")
        if not isinstance(self.max_seq_length, int) or self.max_seq_length < 2:
            raise ConfigError(f"max_seq_length: must be an integer >= 2, got {self.max_seq_length!r}.")
        if self.partition_by is not None and not str(self.partition_by).strip():
            raise ConfigError("partition_by: empty; name a column (e.g. user_id) or leave it unset.")
        if self.split_seed is not None and (isinstance(self.split_seed, bool) or not isinstance(self.split_seed, int)
                                            or self.split_seed < 0):
            raise ConfigError(f"split_seed: must be an integer >= 0 (or unset), got {self.split_seed!r}.")
        for name in ("synthetic_alpha", "synthetic_beta"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= float(value) < float("inf"):
                raise ConfigError(f"{name}: must be a finite number >= 0, got {value!r}.")
        if isinstance(self.synthetic_num_users, bool) or not isinstance(self.synthetic_num_users, int) \
                or self.synthetic_num_users < 1:
            raise ConfigError(f"synthetic_num_users: must be an integer >= 1, got {self.synthetic_num_users!r}.")
        from ..metrics.selection import parse_metrics

        parse_metrics(self.metrics)  # an unknown name: refused now, before anything loads
        if isinstance(self.generation_max_new_tokens, bool) or not isinstance(self.generation_max_new_tokens, int) \
                or self.generation_max_new_tokens < 1:
            raise ConfigError(f"generation_max_new_tokens: must be an integer >= 1, got {self.generation_max_new_tokens!r}.")
        if isinstance(self.generation_prompts, str):  # one prompt given in Python or a YAML file as a string
            self.generation_prompts = [self.generation_prompts]
        for name in ("max_clients", "max_samples_per_client", "max_train_samples", "max_eval_samples"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ConfigError(f"{name}: must be an integer >= 1 (or unset), got {value!r}.")

    @property
    def effective_split_seed(self) -> int:
        """The seed the data is split and sampled with: ``split_seed``, else :data:`DEFAULT_SPLIT_SEED`."""
        return DEFAULT_SPLIT_SEED if self.split_seed is None else int(self.split_seed)


@dataclass
class PartitionArguments:
    """How the training data is split over the clients (read by :func:`hf_fedflat.data.partition_dataset`)."""

    partition_scheme: str = field(
        default="dirichlet",
        metadata={"help": "How the training data is split: iid, dirichlet (per class over clients), "
                          "inner_dirichlet (equal sizes, per client over classes), pathological (k classes each), "
                          "linear (client i's size proportional to i + 1). iid and linear need no label column. "
                          "(--partition_by: one client per id instead.)"},
    )
    dirichlet_alpha: float = field(
        default=0.3, metadata={"help": "Concentration of the Dirichlet partitions (smaller = more heterogeneous)."}
    )
    classes_per_client: int = field(default=2, metadata={"help": "Classes per client of the pathological partition."})
    min_partition_size: int = field(default=2, metadata={"help": "Smallest client dataset a Dirichlet partition may produce."})
    partition_seed: int | None = field(default=None, metadata={"help": "Seed of the partition (default: seed)."})

    def validate(self) -> None:
        for name in ("min_partition_size", "classes_per_client"):
            check_integer(name, getattr(self, name), low=1)
        check_number("dirichlet_alpha", self.dirichlet_alpha, low=0.0, low_open=True)
        check_choice("partition_scheme", self.partition_scheme, SCHEMES)
