"""Federated named-entity recognition with a transformers encoder (BERT on CoNLL-2003 by default).

    accelerate launch recipes/token_classification.py                        # BERT-base cased, CoNLL-2003, 10 clients
    accelerate launch recipes/token_classification.py --fed_algorithm fedsam --rho 0.05
    accelerate launch recipes/token_classification.py --dataset_name path/to/conll_folder   # train.txt, test.txt
    accelerate launch recipes/token_classification.py --partition_by document  # CoNLL files: one client per document
    accelerate launch recipes/token_classification.py --use_lora true        # LoRA adapters + head only on the wire
    accelerate launch recipes/token_classification.py --smoke                # seconds, offline

Model: ``--model_name_or_path`` (default ``google-bert/bert-base-cased``, a masked-LM checkpoint: the token
classification head is new) with ``AutoModelForTokenClassification``; ``id2label`` / ``label2id`` are the data's
tag names, and ``pipeline("token-classification", "<output_dir>/final_model")`` loads the final model.

Data: ``--dataset_name`` (default ``eriktks/conll2003``: ``tokens`` and ``ner_tags`` as a ``Sequence(ClassLabel)``;
train, validation and test splits), any Hub id or save_to_disk / json / parquet copy in that layout, or CoNLL
files (``word ... TAG`` per line, a blank line between sentences, ``-DOCSTART-`` between documents). Words are
tokenized with ``is_split_into_words``; a word's first sub-token carries its tag, the others ``-100``
(``--label_all_tokens true`` labels them all). Clients: 10, a Dirichlet(0.5) skew over each sentence's most
frequent entity type (``sentence_tag``), or ``--partition_by document``. Metrics: entity-level F1, precision and
recall (seqeval) and per-token accuracy, as ``eval_f1``, ``eval_precision``, ``eval_recall``, ``eval_accuracy``.

Optimizer: AdamW lr 5e-5, 20 local steps of batch 16, 5 of 10 clients per round, 20 rounds. ``--smoke`` writes a
tiny random-init BERT token classifier, a WordPiece tokenizer that splits the longer entity words into sub-words,
and 96 + 32 generated CoNLL sentences (``PER``, ``LOC``, ``ORG``) under ``<output_dir>/smoke_assets``, and runs
2 rounds on the CPU.
"""

from __future__ import annotations

import os
import sys

from hf_fedflat.cli.parsing import wants_smoke
from hf_fedflat.cli.recipes import run_recipe, smoke_asset_flags

DEFAULTS = [
    "--fed_algorithm", "fedavg", "--model_name_or_path", "google-bert/bert-base-cased", "--task", "token-classification",
    "--dataset_name", "eriktks/conll2003", "--max_seq_length", "128", "--max_eval_samples", "2000",
    "--num_clients", "10", "--clients_per_round", "5",
    "--partition_scheme", "dirichlet", "--dirichlet_alpha", "0.5", "--num_rounds", "20", "--local_steps", "20",
    "--per_device_train_batch_size", "16", "--per_device_eval_batch_size", "64", "--optim", "adamw_torch",
    "--learning_rate", "5e-5", "--max_grad_norm", "1.0", "--eval_every_n_rounds", "2", "--save_every_n_rounds", "5",
    "--output_dir", "outputs/token_classification",
]
SMOKE = [
    "--model_name_or_path", "outputs/smoke/token_classification/smoke_assets/model",
    "--dataset_name", "outputs/smoke/token_classification/smoke_assets/conll",
    "--max_seq_length", "32", "--num_clients", "4", "--clients_per_round", "2", "--num_rounds", "2",
    "--local_steps", "5", "--per_device_train_batch_size", "8", "--learning_rate", "0.01",
    "--eval_every_n_rounds", "1", "--save_every_n_rounds", "1", "--output_dir", "outputs/smoke/token_classification",
    "--overwrite_output_dir", "true",  # a smoke run's folder is scratch: running it again replaces it
    "--use_cpu", "true",
]


def write_smoke_assets(root: str) -> None:
    """The tiny BERT token classifier + WordPiece tokenizer and the CoNLL files the ``--smoke`` flags point at."""
    from hf_fedflat.data.tiny_text import train_wordpiece_tokenizer, write_conll_data, write_tiny_model

    write_tiny_model(os.path.join(root, "model"), "bert_token_classification", num_labels=7,
                     tokenizer=train_wordpiece_tokenizer())
    write_conll_data(os.path.join(root, "conll"), train_sentences=96, test_sentences=32)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    smoke, assets = smoke_asset_flags(argv, SMOKE, "outputs/smoke/token_classification",
                                      {"--model_name_or_path": "model", "--dataset_name": "conll"})
    if wants_smoke(argv) and not {"-h", "--help"} & set(argv):
        write_smoke_assets(assets)
    experiment, output = run_recipe(argv, DEFAULTS, smoke)
    last = next((r for r in reversed(output.history) if "eval_f1" in r), {})
    if last:
        print(f"final entity F1 {last['eval_f1']:.4f} (precision {last.get('eval_precision', float('nan')):.4f}, "
              f"recall {last.get('eval_recall', float('nan')):.4f})")
    return experiment, output


if __name__ == "__main__":
    from hf_fedflat.cli.exit_codes import run_command_line

    run_command_line(main)
