"""Any Hub or local dataset for a transformers model: ``--dataset_name <hub id or path>``.

A name that is not in the registry (:data:`hf_fedflat.data.catalog.DATASETS`) is loaded here:

* a folder written by ``save_to_disk`` (a ``Dataset`` or a ``DatasetDict``): ``datasets.load_from_disk``;
* a ``.csv`` / ``.json`` / ``.jsonl`` / ``.parquet`` / ``.txt`` file, or a folder of them (one file per split,
  named after it: ``train.csv``, ``test.csv``, ...): ``datasets.load_dataset`` with the matching builder;
* anything else: ``datasets.load_dataset(name, dataset_config_name)`` (a Hub id, or a folder
  ``load_dataset`` understands).

The training split is ``--train_split`` (default ``train``, or the only split unless it is named test, validation,
valid or dev: evaluation rows never train unless named); evaluation uses ``--eval_split``
(default: ``test``, else ``validation``), or, when the data has none, a ``--test_fraction`` held out from
training (stratified by the label when it is a ``ClassLabel``).

Then, with the model's tokenizer (``processing_class``):

``text-classification``
    ``--text_column`` (default: the first of ``text``, ``sentence``, ``content``, ``review``, ``document``;
    ``a,b`` for sentence pairs) tokenized with truncation at ``--max_seq_length``; ``--label_column`` (default
    ``label``) becomes ``labels``: a ``ClassLabel`` keeps its names (the model's ``id2label``), string labels
    are encoded to ids with their sorted values as names (the same ids in every split), integer labels keep their
    values. Batches are padded per batch (``DataCollatorWithPadding``).
``causal-lm``
    Instruction data (columns ``--instruction_column`` / ``--input_column`` / ``--response_column``, Alpaca's
    ``instruction`` / ``input`` / ``output`` by default) is rendered with ``--prompt_template`` (Alpaca's by
    default, :data:`ALPACA_TEMPLATE`), the response and an end-of-sequence token appended; the prompt's tokens
    are labelled ``-100``, so the loss is on the response only. Plain text (``--text_column``) is trained on
    every token. Truncated at ``--max_seq_length``; a row whose response is cut away entirely is dropped (it
    has nothing to learn from) and counted in the log. Batches are padded per batch, labels with ``-100``
    (``DataCollatorForSeq2Seq``). Evaluation reports the loss, the perplexity and the next-token accuracy
    (:mod:`hf_fedflat.metrics.language_modeling`).
``token-classification``
    CoNLL files or a ``tokens`` / ``ner_tags`` layout (chosen by ``--task``, the model, or those columns), words
    tokenized with ``is_split_into_words`` and tags aligned to the first sub-token of each word
    (:mod:`hf_fedflat.data.ner`); entity-level F1 by seqeval.

Clients: ``--partition_by <column>`` gives one client per value of the column (flwr-datasets'
``NaturalIdPartitioner``; :func:`hf_fedflat.data.partition.natural_id_partition`); otherwise the partition
arguments apply (``iid`` and the size-based schemes need no label column).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

import datasets

from ..field_checks import ConfigError
from ..models.arguments import ModelArguments
from .arguments import DataArguments

__all__ = [
    "ALPACA_TEMPLATE",
    "ALPACA_TEMPLATE_NO_INPUT",
    "FILE_BUILDERS",
    "build_instruction_features",
    "check_label_values",
    "encode_labels",
    "load_hf_dataset",
    "load_raw_dataset",
    "split_train_eval",
    "tokenize_classification",
    "tokenize_instructions",
]

logger = logging.getLogger(__name__)

IGNORE_INDEX = -100

FILE_BUILDERS = {".csv": "csv", ".tsv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet", ".txt": "text"}
"""File suffix -> ``datasets`` builder."""

ALPACA_TEMPLATE = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)
"""Alpaca's prompt for a row with an input (Taori et al. 2023); ``{instruction}`` and ``{input}`` are filled."""

ALPACA_TEMPLATE_NO_INPUT = (
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:\n"
)
"""Alpaca's prompt for a row whose input is empty."""

_TEXT_COLUMNS = ("text", "sentence", "content", "review", "document")
_EVAL_SPLITS = ("test", "validation", "valid", "dev")


# -------------------------------------------------------------------------------------------------
# loading
# -------------------------------------------------------------------------------------------------
def _is_saved_dataset(path: str) -> bool:
    names = set(os.listdir(path))
    return "dataset_dict.json" in names or "state.json" in names


def _data_files(folder: str) -> tuple[str, dict[str, list[str]]] | None:
    """``(builder, {split: files})`` for a folder of data files named after their split (``train.csv``).

    An entry named like a data file that is not a file (``train.csv/`` a folder) is refused: skipping it would
    leave the other splits to train on."""
    files: dict[str, list[str]] = {}
    builders = set()
    for name in sorted(os.listdir(folder)):
        stem, suffix = os.path.splitext(name)
        if suffix.lower() not in FILE_BUILDERS:
            continue
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            raise ConfigError(f"dataset_name: {path!r} is a folder, not a data file; put the {stem!r} rows in a "
                              f"file named {name} there, or remove the folder.")
        builders.add(FILE_BUILDERS[suffix.lower()])
        files.setdefault(stem, []).append(path)
    if not files:
        return None
    if len(builders) > 1:
        raise ConfigError(f"dataset_name: {folder!r} mixes data file types ({', '.join(sorted(builders))}); keep one.")
    return builders.pop(), files


def _load_files(builder: str, files: dict[str, list[str]], where: str, **options) -> datasets.DatasetDict:
    """``datasets.load_dataset`` on local files; a file it cannot read or parse (no rows, a malformed line, a
    row with more cells than the header, no permission) is one :class:`ConfigError` naming ``where`` and why."""
    for group in files.values():
        for file in group:
            if not os.access(file, os.R_OK):
                raise ConfigError(f"dataset_name: {file!r} is not readable by this user; fix its permissions.")
            if os.path.getsize(file) == 0:
                raise ConfigError(f"dataset_name: {file!r} is empty; give it a header and rows.")
    try:
        loaded = datasets.load_dataset(builder, data_files=files, **options)
    except Exception as error:  # DatasetGenerationError, ParserError, ArrowInvalid, UnicodeDecodeError, ...
        cause = error.__cause__ or error.__context__ or error
        detail = " ".join(str(cause).split())[:300] or type(cause).__name__
        raise ConfigError(f"dataset_name: {where!r} could not be read as {builder} ({type(cause).__name__}: "
                          f"{detail}); fix the file (one header, the same cells in every row, one JSON object "
                          "per line).") from error
    for split, rows in loaded.items():
        if len(rows) == 0:
            raise ConfigError(f"dataset_name: the {split!r} rows of {where!r} ({', '.join(files[split])}) are "
                              "empty (a header, or nothing, but no row); add rows.")
    return loaded


def load_raw_dataset(name_or_path: str, config_name: str | None = None, *,
                     train_split: str = "train") -> datasets.DatasetDict:
    """The dataset as a ``DatasetDict`` (a single ``Dataset`` becomes its ``train`` split); see the module doc.

    In a folder of data files, a file named after an evaluation split (``test``, ``validation``, ``valid``,
    ``dev``) never becomes training rows: without a ``<train_split>.<ext>`` file it keeps its split's name, and
    :func:`split_train_eval` refuses the run naming what the folder holds.

    Raises:
        ConfigError / DatasetUnavailableError (an ``OSError``): Nothing loadable there; the message says what was
            tried.
    """
    path = os.path.expanduser(name_or_path)
    if os.path.isdir(path) and _is_saved_dataset(path):
        loaded = datasets.load_from_disk(path)
    elif os.path.isfile(path):
        suffix = os.path.splitext(path)[1].lower()
        if suffix not in FILE_BUILDERS:
            raise ConfigError(f"dataset_name: {path!r} is a {suffix or 'suffix-less'} file; use one of "
                             f"{', '.join(sorted(FILE_BUILDERS))}, a save_to_disk folder or a Hub id.")
        loaded = _load_files(FILE_BUILDERS[suffix], {"train": [path]}, path,
                             **({"delimiter": "\t"} if suffix == ".tsv" else {}))
    elif os.path.isdir(path) and (found := _data_files(path)) is not None:
        builder, files = found
        if train_split not in files:  # files named after no split (shards): one training split of all of them
            shards = [f for stem, group in files.items() if stem not in _EVAL_SPLITS for f in group]
            files = {stem: group for stem, group in files.items() if stem in _EVAL_SPLITS}
            if not shards:
                held = ", ".join(os.path.basename(f) for group in files.values() for f in group)
                raise ConfigError(
                    f"dataset_name: {path!r} holds {held} and no {train_split}.<ext> file; evaluation rows are never "
                    f"trained on unless named: add {train_split}.<ext>, or pass --train_split <split> to train on "
                    "one of these.")
            files[train_split] = shards
        loaded = _load_files(builder, files, path)
    else:
        try:
            loaded = datasets.load_dataset(name_or_path, config_name)
        except Exception as error:  # DatasetNotFoundError, ConnectionError, FileNotFoundError, ...
            from .images import DatasetUnavailableError  # (an OSError; the command line reports it in one line)

            where = "local folder" if os.path.isdir(path) else "Hub dataset"
            raise DatasetUnavailableError(
                f"dataset_name: cannot load the {where} {name_or_path!r} ({type(error).__name__}: {error}). Give a "
                "registered name (hf-fedflat list), a Hub id reachable from here, a save_to_disk folder, or csv/json/"
                "jsonl/parquet files (a file, or a folder with train.<ext> and test.<ext>)."
            ) from error
    if isinstance(loaded, datasets.Dataset):
        loaded = datasets.DatasetDict({"train": loaded})
    if not isinstance(loaded, datasets.DatasetDict):
        raise ConfigError(f"dataset_name: {name_or_path!r} loaded as {type(loaded).__name__}, not a Dataset(Dict).")
    return loaded


def split_train_eval(
    data: datasets.DatasetDict, *, train_split: str = "train", eval_split: str | None = None,
    test_fraction: float = 0.2, seed: int = 0, stratify_column: str | None = None,
) -> tuple[datasets.Dataset, datasets.Dataset, str]:
    """``(train, eval, where eval came from)``: the named splits, or ``test_fraction`` held out of ``train``."""
    splits = list(data)
    if train_split not in data:
        if len(splits) == 1 and train_split == "train" and splits[0] not in _EVAL_SPLITS:
            train_split = splits[0]
        elif any(name in _EVAL_SPLITS for name in splits):  # evaluation rows train only when named so
            raise ConfigError(
                f"train_split: the dataset holds the split(s) {', '.join(splits)} and no {train_split!r} split; "
                f"evaluation rows are never trained on unless named: add {train_split}.<ext> (or a "
                f"{train_split!r} split), or pass --train_split <split> to train on one of these.")
        else:
            raise ConfigError(f"train_split: no split {train_split!r} in the dataset (splits: {', '.join(splits)}).")
    if eval_split is not None:
        if eval_split not in data:
            raise ConfigError(f"eval_split: no split {eval_split!r} in the dataset (splits: {', '.join(splits)}).")
        if eval_split == train_split:
            raise ConfigError(f"eval_split: {eval_split!r} is also the training split; name another split, or leave "
                             "eval_split unset to hold out --test_fraction of the training rows.")
        return data[train_split], data[eval_split], f"split {eval_split!r}"
    for name in _EVAL_SPLITS:
        if name in data and name != train_split:
            return data[train_split], data[name], f"split {name!r}"
    train = data[train_split]
    stratify = None
    if stratify_column and isinstance(train.features.get(stratify_column), datasets.ClassLabel):
        stratify = stratify_column
    try:
        held = train.train_test_split(test_size=test_fraction, seed=seed, stratify_by_column=stratify)
    except ValueError:  # a class too small to stratify
        held = train.train_test_split(test_size=test_fraction, seed=seed)
    return held["train"], held["test"], f"{test_fraction:g} of {train_split!r} held out (seed {seed})"


# -------------------------------------------------------------------------------------------------
# labels
# -------------------------------------------------------------------------------------------------
def check_label_values(splits: dict[str, datasets.Dataset], column: str, source: str, *,
                       drop_missing: bool = False) -> dict[str, datasets.Dataset]:
    """The splits with labels a classifier can take, before they are encoded (:func:`encode_labels`).

    Refused with an :class:`~hf_fedflat.data.input_checks.InvalidInputError` naming the column and ``source`` (the
    file or dataset), in one line:

    * rows without a label (null, or NaN: a CSV's empty cell) -- with ``drop_missing`` (``--drop_invalid_rows``)
      those rows are dropped instead, and their count logged;
    * text labels that mix class ids with class names (``0``, ``1``, ``negative``, ``positive``): encoded as they are
      they would be four classes, ``0`` and ``negative`` apart.

    A float column whose values are all whole numbers (what a CSV with an empty label cell reads as) becomes
    integer class ids.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from .input_checks import InvalidInputError

    out: dict[str, datasets.Dataset] = {}
    for name, split in splits.items():
        values = split.select_columns([column]).with_format("arrow")[:].column(column)
        missing = values.is_null()
        if pa.types.is_floating(values.type):
            missing = pc.or_(missing, pc.fill_null(pc.is_nan(values), False))
        rows = np.flatnonzero(np.asarray(missing.to_numpy(zero_copy_only=False), dtype=bool))
        if rows.size and not drop_missing:
            shown = ", ".join(map(str, rows[:5].tolist())) + (" ..." if rows.size > 5 else "")
            raise InvalidInputError(
                f"label_column: {column!r} of {source} has {rows.size} of {len(split)} rows of its {name!r} split "
                f"without a label (an empty cell, null or NaN; rows {shown}, counted from 0); fill them in, or drop "
                "those rows with --drop_invalid_rows.")
        if rows.size:
            logger.warning("drop_invalid_rows: dropped %d of the %d %s rows of %s without a label in %r.", rows.size,
                           len(split), name, source, column)
            split = split.select(np.setdiff1d(np.arange(len(split)), rows))
        dtype = getattr(split.features[column], "dtype", None)
        if dtype in ("float16", "float32", "float64") and len(split):
            numbers = np.asarray(split.select_columns([column]).with_format("numpy")[:][column], dtype=np.float64)
            if np.all(numbers == np.round(numbers)):
                split = split.cast_column(column, datasets.Value("int64"))
        out[name] = split
    dtype = getattr(next(iter(out.values())).features[column], "dtype", None)
    if dtype in ("string", "large_string"):
        found = sorted({str(v) for split in out.values() for v in split.unique(column) if v is not None})
        ids = [v for v in found if v.strip().lstrip("+-").isdigit()]
        if ids and len(ids) < len(found):
            shown = ", ".join(found[:12]) + (" ..." if len(found) > 12 else "")
            raise InvalidInputError(
                f"label_column: {column!r} of {source} mixes class ids and class names ({shown}): as they are they "
                f"would be {len(found)} classes, {ids[0]!r} and {next(v for v in found if v not in ids)!r} apart; "
                "write every label one way (all names, or all ids).")
    return out


def encode_labels(splits: dict[str, datasets.Dataset], column: str) -> tuple[dict[str, datasets.Dataset], list[str] | None]:
    """Every split's ``column`` as class ids, and the class names (index = id) when the data has them.

    A ``ClassLabel`` keeps its ids and names; string (or bool) labels become a ``ClassLabel`` whose names are
    the sorted values found in all the splits together, so an id means the same class everywhere; integer
    labels are kept (names ``None``: ``LABEL_<i>``). Float labels are refused (a classifier needs class ids).
    """
    first = next(iter(splits.values()))
    feature = first.features[column]
    if isinstance(feature, datasets.ClassLabel):
        for name, split in splits.items():
            other = split.features[column]
            if not isinstance(other, datasets.ClassLabel) or list(other.names) != list(feature.names):
                raise ConfigError(f"label_column: the {name!r} split's {column!r} classes differ from the others'.")
        return splits, list(feature.names)
    dtype = getattr(feature, "dtype", None)
    if dtype in ("string", "large_string", "bool"):
        values = sorted({str(v) for split in splits.values() for v in split[column] if v is not None})
        label = datasets.ClassLabel(names=values)
        out = {}
        for name, split in splits.items():
            features = split.features.copy()
            features[column] = label
            out[name] = split.map(lambda batch: {column: [label.str2int(str(v)) for v in batch[column]]},
                                  batched=True, features=features, desc="encoding labels")
        logger.info("label_column %r: %d string classes encoded as ids (%s)", column, len(values),
                    ", ".join(f"{i}={v}" for i, v in enumerate(values[:10])) + (" ..." if len(values) > 10 else ""))
        return out, values
    if dtype is not None and dtype.startswith(("int", "uint")):
        return splits, None
    raise ConfigError(f"label_column: {column!r} holds {feature} values; a classifier needs class ids or names "
                     "(ClassLabel, integers or strings).")


# -------------------------------------------------------------------------------------------------
# tokenization
# -------------------------------------------------------------------------------------------------
def _text_columns(dataset: datasets.Dataset, text_column: str | None) -> list[str]:
    if text_column:
        columns = [c.strip() for c in text_column.split(",") if c.strip()]
        if not 1 <= len(columns) <= 2:
            raise ConfigError(f"text_column: one column, or two separated by a comma (a pair), got {text_column!r}.")
        missing = [c for c in columns if c not in dataset.column_names]
        if missing:
            raise ConfigError(f"text_column: {', '.join(map(repr, missing))} not a column of the dataset "
                             f"(columns: {', '.join(dataset.column_names)}).")
        return columns
    for name in _TEXT_COLUMNS:
        if name in dataset.column_names:
            return [name]
    raise ConfigError(f"text_column: none of {', '.join(_TEXT_COLUMNS)} is a column of the dataset "
                     f"(columns: {', '.join(dataset.column_names)}); pass --text_column.")


def tokenize_classification(dataset: datasets.Dataset, tokenizer, *, text_columns: Sequence[str], label_column: str,
                            max_seq_length: int, keep: Sequence[str] = ()) -> datasets.Dataset:
    """``input_ids`` / ``attention_mask`` (/ ``token_type_ids``) and ``labels``; other columns dropped except ``keep``."""
    columns = list(text_columns)

    def encode(batch):
        texts = [["" if t is None else str(t) for t in batch[c]] for c in columns]
        return tokenizer(*texts, truncation=True, max_length=max_seq_length)

    drop = [c for c in dataset.column_names if c not in (label_column, *keep)]
    out = dataset.map(encode, batched=True, remove_columns=drop, desc="tokenizing")
    if label_column != "labels":
        if "labels" in out.column_names:
            out = out.remove_columns("labels")
        out = out.rename_column(label_column, "labels")
    return out


def build_instruction_features(prompt_ids: list[int], response_ids: list[int], eos_id: int | None,
                               max_seq_length: int) -> dict[str, list[int]] | None:
    """One training row: ``prompt + response + eos`` cut at ``max_seq_length``, the prompt labelled ``-100``.

    Returns None when nothing of the response is left after the cut (no token to learn from)."""
    response = list(response_ids) + ([eos_id] if eos_id is not None else [])
    ids = (list(prompt_ids) + response)[:max_seq_length]
    labels = ([IGNORE_INDEX] * len(prompt_ids) + response)[:max_seq_length]
    # a causal LM predicts token t from the tokens before it: a label at position 0 is never scored
    if all(label == IGNORE_INDEX for label in labels[1:]):
        return None
    return {"input_ids": ids, "attention_mask": [1] * len(ids), "labels": labels}


def _render(template: str, row: dict[str, Any]) -> str:
    try:
        return template.format(**{k: "" if v is None else v for k, v in row.items()})
    except KeyError as error:
        raise ConfigError(f"prompt_template: {{{error.args[0]}}} is not a column of the dataset "
                         f"(columns: {', '.join(row)}).") from None


def tokenize_instructions(dataset: datasets.Dataset, tokenizer, *, max_seq_length: int,
                          instruction_column: str = "instruction", input_column: str | None = "input",
                          response_column: str = "output", prompt_template: str | None = None,
                          keep: Sequence[str] = ()) -> tuple[datasets.Dataset, int]:
    """Instruction rows -> ``input_ids`` / ``attention_mask`` / ``labels`` (loss on the response only).

    ``prompt_template`` is a ``str.format`` template over the row's columns (default Alpaca's, without the input
    part when ``input_column`` is missing or empty). The prompt is tokenized with the tokenizer's special tokens
    (a BOS for Llama-style tokenizers), the response without them, and joined, so the boundary between them is
    exactly where the labels start. Returns ``(dataset, rows dropped because the cut left no response)``.
    """
    for name in (instruction_column, response_column):
        if name not in dataset.column_names:
            raise ConfigError(f"{'instruction' if name == instruction_column else 'response'}_column: {name!r} is not a "
                             f"column of the dataset (columns: {', '.join(dataset.column_names)}).")
    has_input = bool(input_column) and input_column in dataset.column_names
    eos_id = tokenizer.eos_token_id

    def prompts(batch) -> list[str]:
        rows = [dict(zip(batch, values)) for values in zip(*batch.values())]
        out = []
        for row in rows:
            row = {**row, "instruction": row[instruction_column], "input": row.get(input_column) if has_input else ""}
            if prompt_template is not None:
                out.append(_render(prompt_template, row))
            else:
                out.append(_render(ALPACA_TEMPLATE if row["input"] else ALPACA_TEMPLATE_NO_INPUT, row))
        return out

    def encode(batch):
        prompt_ids = tokenizer(prompts(batch), add_special_tokens=True)["input_ids"]
        responses = ["" if r is None else str(r) for r in batch[response_column]]
        response_ids = tokenizer(responses, add_special_tokens=False)["input_ids"]
        out: dict[str, list] = {"input_ids": [], "attention_mask": [], "labels": [], "__kept__": []}
        for name in keep:
            out[name] = []
        for i, (p, r) in enumerate(zip(prompt_ids, response_ids)):
            row = build_instruction_features(p, r, eos_id, max_seq_length)
            out["__kept__"].append(row is not None)
            row = row or {"input_ids": [], "attention_mask": [], "labels": []}
            for key, value in row.items():
                out[key].append(value)
            for name in keep:
                out[name].append(batch[name][i])
        return out

    encoded = dataset.map(encode, batched=True, remove_columns=dataset.column_names, desc="tokenizing")
    kept = encoded["__kept__"]
    dropped = len(kept) - int(sum(kept))
    if dropped:
        encoded = encoded.filter(lambda flag: flag, input_columns="__kept__")
    return encoded.remove_columns("__kept__"), dropped


def tokenize_text(dataset: datasets.Dataset, tokenizer, *, text_column: str, max_seq_length: int,
                  keep: Sequence[str] = ()) -> datasets.Dataset:
    """Plain text for a causal LM: every token is a label (the collator pads labels with ``-100``)."""
    eos_id = tokenizer.eos_token_id

    def encode(batch):
        ids = tokenizer(["" if t is None else str(t) for t in batch[text_column]], add_special_tokens=True)["input_ids"]
        ids = [(row + ([eos_id] if eos_id is not None else []))[:max_seq_length] for row in ids]
        return {"input_ids": ids, "attention_mask": [[1] * len(r) for r in ids], "labels": [list(r) for r in ids]}

    drop = [c for c in dataset.column_names if c not in keep]
    out = dataset.map(encode, batched=True, remove_columns=drop, desc="tokenizing")
    return out.filter(lambda ids: len(ids) >= 2, input_columns="input_ids")


# -------------------------------------------------------------------------------------------------
# the loader behind --dataset_name <hub id or path>
# -------------------------------------------------------------------------------------------------
def _looks_like_instructions(dataset: datasets.Dataset, data_args: DataArguments) -> bool:
    return data_args.instruction_column in dataset.column_names and data_args.response_column in dataset.column_names


def _data_task(model_args: ModelArguments, dataset: datasets.Dataset, data_args: DataArguments) -> str:
    """The task the data is prepared for: ``--task``, else the model's, else the columns (instructions: causal-lm)."""
    from ..models.auto import resolve_task

    guess = "causal-lm" if _looks_like_instructions(dataset, data_args) else "text-classification"
    if (data_args.text_column or "tokens") in dataset.column_names \
            and (data_args.label_column or "ner_tags") in dataset.column_names:
        guess = "token-classification"  # words and their tags per row: the Hub's NER layout
    if model_args.model_name_or_path is None:
        raise ConfigError(
            f"model_name_or_path: --dataset_name {data_args.dataset_name!r} is not a registered dataset, so it is "
            "tokenized for a transformers model; pass --model_name_or_path (a Hub id or a local folder with its "
            "tokenizer), or use a registered dataset (hf-fedflat list)."
        )
    return resolve_task(model_args, guess)


def load_hf_dataset(data_args: DataArguments, model_args: ModelArguments, seed: int, *,
                    processing_class=None) -> dict[str, Any]:
    """``--dataset_name`` as a Hub id or a local path, tokenized for ``--model_name_or_path``'s task.

    Returns the fields of a :class:`~hf_fedflat.data.catalog.FederatedData` (``load_data`` builds it) with
    ``processing_class`` (the tokenizer),
    ``data_collator``, ``label_names`` (classification), the metrics of the task (causal LM: perplexity and
    token accuracy) and, with ``--partition_by``, the natural-id partition.
    """
    from .ner import check_ner_columns, conll_dataset, conll_files, prepare_ner_data
    from .partition import natural_id_partition

    conll = conll_files(data_args.dataset_name)  # CoNLL files: token classification (hf_fedflat.data.ner)
    if conll is not None:
        raw = conll_dataset(conll)
    else:
        raw = load_raw_dataset(data_args.dataset_name, data_args.dataset_config_name,
                               train_split=data_args.train_split)
    task = _data_task(model_args, raw[next(iter(raw))], data_args)
    if conll is not None and task != "token-classification":
        raise ConfigError(f"task: {data_args.dataset_name!r} holds CoNLL files (words and their tags) but the model "
                          f"is for {task}; pass --task token-classification.")
    if task == "token-classification":
        check_ner_columns(raw, data_args)
    if task not in ("text-classification", "token-classification", "causal-lm"):
        raise ConfigError(f"task: --dataset_name {data_args.dataset_name!r} is tokenized for text-classification, "
                         f"token-classification or causal-lm; {task!r} data needs a registered loader "
                         "(hf_fedflat.data.catalog).")
    if processing_class is None:
        from ..models.auto import load_processing_class

        processing_class = load_processing_class(model_args, task)
    tokenizer = processing_class
    label_column = data_args.label_column or "label"
    stratify = label_column if task == "text-classification" else None
    if stratify and all(label_column in split.column_names for split in raw.values()):  # rows as in the files
        raw = datasets.DatasetDict(check_label_values(dict(raw), label_column, data_args.dataset_name,
                                                      drop_missing=data_args.drop_invalid_rows))
    train, test, source = split_train_eval(raw, train_split=data_args.train_split, eval_split=data_args.eval_split,
                                           test_fraction=data_args.test_fraction, seed=seed, stratify_column=stratify)
    if data_args.max_train_samples is not None and len(train) > data_args.max_train_samples:
        train = train.shuffle(seed=seed).select(range(data_args.max_train_samples))
    if data_args.max_eval_samples is not None and len(test) > data_args.max_eval_samples:
        test = test.shuffle(seed=seed).select(range(data_args.max_eval_samples))
    keep = [data_args.partition_by] if data_args.partition_by else []
    if data_args.partition_by and data_args.partition_by not in train.column_names:
        raise ConfigError(f"partition_by: {data_args.partition_by!r} is not a column of the dataset "
                         f"(columns: {', '.join(train.column_names)}).")
    max_len = data_args.max_seq_length
    label_names = None
    hub_id = None if os.path.exists(os.path.expanduser(data_args.dataset_name)) else data_args.dataset_name
    name = os.path.basename(os.path.normpath(data_args.dataset_name)) if hub_id is None else hub_id
    if task == "token-classification":  # words and their tags: hf_fedflat.data.ner
        prepared = prepare_ner_data(train, test, data_args, tokenizer, task=task)
        logger.info("%s: %d training and %d evaluation sentences (%s), %d tags", data_args.dataset_name,
                    len(prepared["train"]), len(prepared["eval"]), source, len(prepared["label_names"]))
        return dict(name=name, hub_id=hub_id, **prepared)
    if task == "text-classification":
        if label_column not in train.column_names:
            raise ConfigError(f"label_column: {label_column!r} is not a column of the dataset (columns: "
                             f"{', '.join(train.column_names)}); pass --label_column.")
        encoded, label_names = encode_labels({"train": train, "eval": test}, label_column)
        train, test = encoded["train"], encoded["eval"]
        columns = _text_columns(train, data_args.text_column)
        train = tokenize_classification(train, tokenizer, text_columns=columns, label_column=label_column,
                                        max_seq_length=max_len, keep=keep)
        test = tokenize_classification(test, tokenizer, text_columns=columns, label_column=label_column,
                                       max_seq_length=max_len)
        if label_names is not None:
            num_classes = len(label_names)
        else:
            values = [int(v) for split in (train, test) for v in split["labels"]]
            num_classes = max(values) + 1 if values else 0
        from transformers import DataCollatorWithPadding

        collator = DataCollatorWithPadding(tokenizer)
        metrics: dict[str, Any] = {}
    else:
        if _looks_like_instructions(train, data_args) and not data_args.text_column:
            options = dict(max_seq_length=max_len, instruction_column=data_args.instruction_column,
                           input_column=data_args.input_column, response_column=data_args.response_column,
                           prompt_template=data_args.prompt_template)
            train, dropped_train = tokenize_instructions(train, tokenizer, keep=keep, **options)
            test, dropped_test = tokenize_instructions(test, tokenizer, **options)
            if dropped_train or dropped_test:
                logger.warning("%d training and %d evaluation rows dropped: their prompt fills max_seq_length=%d, "
                               "leaving no response token to learn from (raise --max_seq_length)",
                               dropped_train, dropped_test, max_len)
        else:
            column = _text_columns(train, data_args.text_column)[0]
            train = tokenize_text(train, tokenizer, text_column=column, max_seq_length=max_len, keep=keep)
            test = tokenize_text(test, tokenizer, text_column=column, max_seq_length=max_len)
        from transformers import DataCollatorForSeq2Seq

        collator = DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=IGNORE_INDEX, padding=True)
        num_classes = len(tokenizer)
        from ..metrics.language_modeling import causal_lm_metrics, token_statistics

        metrics = {"compute_metrics": causal_lm_metrics, "preprocess_logits_for_metrics": token_statistics}
    if not len(train):
        raise ConfigError(f"dataset_name: no training rows left in {data_args.dataset_name!r} after tokenization.")
    partition = None
    if data_args.partition_by:
        partition = natural_id_partition(train, data_args.partition_by, label_column="labels")
        train = train.remove_columns(data_args.partition_by)
    logger.info("%s: %d training rows, %d evaluation rows (%s), task %s", data_args.dataset_name, len(train), len(test),
                source, task)
    return dict(name=name, train=train, eval=test, num_classes=num_classes, in_chans=0, label_column="labels",
                hub_id=hub_id, task=task, partition=partition, label_names=label_names, processing_class=tokenizer,
                data_collator=collator, **metrics)
