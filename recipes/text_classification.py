"""Federated text classification with a transformers encoder (DistilBERT on IMDB by default).

    accelerate launch recipes/text_classification.py                        # DistilBERT, IMDB, Dir(0.5) over 10 clients
    accelerate launch recipes/text_classification.py --fed_algorithm fedsam --rho 0.05
    accelerate launch recipes/text_classification.py --dataset_name reviews.csv --text_column body \\
        --label_column stars --partition_by user_id                         # one client per user (natural id)
    accelerate launch recipes/text_classification.py --use_lora true        # LoRA adapters + head only on the wire
    accelerate launch recipes/text_classification.py --smoke                # seconds, offline

Model: ``--model_name_or_path`` (default ``distilbert/distilbert-base-uncased``, a masked-LM checkpoint; the
classification head is new) with ``AutoModelForSequenceClassification``; ``num_labels`` and ``id2label`` come
from the dataset's ``ClassLabel`` names (``neg``/``pos`` for IMDB); the tokenizer loads from the same path, pads per
batch and is saved in ``final_model/``, which ``pipeline("text-classification", "<output_dir>/final_model")``
loads.

Data: ``--dataset_name`` (default ``stanfordnlp/imdb``: ``text``, ``label``; train and test splits), any Hub id
or local save_to_disk / csv / json / jsonl / parquet; string labels are encoded (sorted names). Truncated at
``--max_seq_length`` 256; evaluation on at most ``--max_eval_samples`` 2,000 test rows.
Clients: 10 with a Dirichlet(0.5) label skew, or ``--partition_by <column>`` for one client per value.

Optimizer: AdamW lr 5e-5 (with plain SGD at the papers' rates a BERT stays at chance), 20 local steps of batch
16, 5 of 10 clients per round, 20 rounds. ``--smoke`` writes a tiny random-init BERT, its tokenizer and an
IMDB-format ``save_to_disk`` copy of 160 short reviews under ``<output_dir>/smoke_assets`` and
runs 2 rounds on the CPU.
"""

from __future__ import annotations

import os
import sys

from hf_fedflat.cli.parsing import wants_smoke
from hf_fedflat.cli.recipes import run_recipe, smoke_asset_flags

DEFAULTS = [
    "--model_name_or_path", "distilbert/distilbert-base-uncased", "--task", "text-classification",
    "--dataset_name", "stanfordnlp/imdb", "--max_seq_length", "256", "--max_eval_samples", "2000",
    "--fed_algorithm", "fedavg", "--num_clients", "10", "--clients_per_round", "5",
    "--partition_scheme", "dirichlet", "--dirichlet_alpha", "0.5", "--num_rounds", "20", "--local_steps", "20",
    "--per_device_train_batch_size", "16", "--per_device_eval_batch_size", "64", "--optim", "adamw_torch",
    "--learning_rate", "5e-5", "--max_grad_norm", "1.0", "--eval_every_n_rounds", "2", "--save_every_n_rounds", "5",
    "--output_dir", "outputs/text_classification",
]
SMOKE = [
    "--model_name_or_path", "outputs/smoke/text_classification/smoke_assets/model",
    "--dataset_name", "outputs/smoke/text_classification/smoke_assets/imdb",
    "--max_seq_length", "32", "--num_clients", "4", "--clients_per_round", "2", "--num_rounds", "2",
    "--local_steps", "3", "--per_device_train_batch_size", "8", "--learning_rate", "0.003",
    "--eval_every_n_rounds", "1", "--save_every_n_rounds", "1", "--output_dir", "outputs/smoke/text_classification",
    "--overwrite_output_dir", "true",  # a smoke run's folder is scratch: running it again replaces it
    "--use_cpu", "true",
]


def write_smoke_assets(root: str) -> None:
    """The tiny BERT + tokenizer and the IMDB-format data the ``--smoke`` flags point at (offline)."""
    from hf_fedflat.data.tiny_text import write_sentiment_data, write_tiny_model

    write_tiny_model(os.path.join(root, "model"), "bert")
    write_sentiment_data(os.path.join(root, "imdb"), train_rows=128, test_rows=32)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    smoke, assets = smoke_asset_flags(argv, SMOKE, "outputs/smoke/text_classification",
                                      {"--model_name_or_path": "model", "--dataset_name": "imdb"})
    if wants_smoke(argv) and not {"-h", "--help"} & set(argv):
        write_smoke_assets(assets)
    return run_recipe(argv, DEFAULTS, smoke)


if __name__ == "__main__":
    from hf_fedflat.cli.exit_codes import run_command_line

    run_command_line(main)
