"""Token classification (NER) data for a transformers model: CoNLL files or the Hub's ``tokens`` / ``ner_tags``.

``--dataset_name`` is, for a ``token-classification`` model (``--task token-classification``, or a checkpoint
saved as ``*ForTokenClassification``):

* **CoNLL files**: one ``token ... TAG`` per line (the first column is the word, the last its tag; CoNLL-2003's
  part-of-speech and chunk columns in between are ignored), a blank line between sentences, ``-DOCSTART-`` lines
  starting a new document (and skipped). A file (``.conll``, ``.iob``, ``.iob2``, ``.bio``, or a ``.txt`` whose
  first lines read as ``token TAG``), or a folder of them named after their split (``train.txt``, ``valid.txt``,
  ``test.txt``). Tags are strings; their names are ``O`` first, then the others sorted by entity type
  (``B-`` before ``I-``), the same ids in every split.
* **the Hub layout** (any Hub id, ``save_to_disk`` folder or json/parquet files): a column of words (``tokens``, or
  ``--text_column``) and one of tags (``ner_tags``, or ``--label_column``) per sentence. A
  ``Sequence(ClassLabel)`` tag column keeps its ids and names (``conll2003``'s ``O``, ``B-PER``, ...); string tags
  are named as for CoNLL files. Tags without names are refused: entity F1 needs them.

Tokenization: the words with ``is_split_into_words=True`` (a fast tokenizer: it maps sub-words to words), cut at
``--max_seq_length``. Label alignment: the first sub-token of a word gets the word's tag, its other sub-tokens and
the special tokens ``-100`` (not scored); with ``--label_all_tokens`` every sub-token is labelled, the ones after
the first with the ``I-`` tag of a ``B-`` word (so the entity count stays the same). Batches are padded by
``DataCollatorForTokenClassification`` (labels with ``-100``).

Clients: each sentence is one row. The partition schemes read ``sentence_tag``, the sentence's most frequent entity
type (``B-``/``I-`` merged; on a tie the first to appear; ``O`` when it has none): ``--partition_scheme
dirichlet`` skews the entity types over the clients, ``iid`` ignores them. ``--partition_by document`` gives one
client per document of a CoNLL file (``-DOCSTART-`` blocks; a Hub copy: any column naming each sentence's
source). The model's ``id2label`` / ``label2id`` are the tag names; the metrics are entity-level F1, precision,
recall and per-token accuracy (:mod:`hf_fedflat.metrics.sequence_labeling`).
"""

from __future__ import annotations

import logging
import os
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import datasets

from ..field_checks import ConfigError
from .arguments import DataArguments

__all__ = [
    "CONLL_SUFFIXES",
    "SENTENCE_TAG",
    "TokenClassificationCollator",
    "align_labels",
    "check_ner_columns",
    "conll_dataset",
    "conll_files",
    "encode_tags",
    "prepare_ner_data",
    "read_conll",
    "sentence_tag",
    "tag_names",
    "tokenize_and_align",
]

logger = logging.getLogger(__name__)

IGNORE_INDEX = -100
#: suffixes always read as CoNLL files; a ``.txt`` file is when its first lines read as ``token TAG``
CONLL_SUFFIXES = (".conll", ".iob", ".iob2", ".bio")
#: the column the partition schemes read: each sentence's most frequent entity type
SENTENCE_TAG = "sentence_tag"
DOCSTART = "-DOCSTART-"
_TAG = re.compile(r"^(O|[BIESLU]-\S+|[BIESLU]|-X-)$")
_SPLIT_NAMES = {"train": "train", "training": "train", "test": "test", "testb": "test", "valid": "validation",
                "validation": "validation", "dev": "validation", "testa": "validation"}


# -------------------------------------------------------------------------------------------------
# CoNLL files
# -------------------------------------------------------------------------------------------------
def _looks_like_conll(path: str, lines: int = 20) -> bool:
    """Whether the first ``lines`` non-blank lines of ``path`` are ``token ... TAG`` lines (or ``-DOCSTART-``)."""
    seen = 0
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                fields = line.split()
                if not fields:
                    continue
                if fields[0] != DOCSTART and (len(fields) < 2 or not _TAG.match(fields[-1])):
                    return False
                seen += 1
                if seen >= lines:
                    break
    except (OSError, UnicodeDecodeError):
        return False
    return seen > 0


def _is_conll_file(path: str) -> bool:
    suffix = os.path.splitext(path)[1].lower()
    return os.path.isfile(path) and (suffix in CONLL_SUFFIXES or (suffix == ".txt" and _looks_like_conll(path)))


def conll_files(name_or_path: str) -> dict[str, list[str]] | None:
    """``{split: [files]}`` when ``name_or_path`` is a CoNLL file (its one split ``train``) or a folder of them
    named after their split (``train.txt``, ``valid.txt``, ``test.txt``; ``dev``/``validation`` too); else None."""
    path = os.path.expanduser(name_or_path)
    if os.path.isfile(path):
        return {"train": [path]} if _is_conll_file(path) else None
    if not os.path.isdir(path):
        return None
    files: dict[str, list[str]] = {}
    for entry in sorted(os.listdir(path)):
        full = os.path.join(path, entry)
        stem = os.path.splitext(entry)[0].lower()
        if _is_conll_file(full):
            files.setdefault(_SPLIT_NAMES.get(stem, stem), []).append(full)
    if not files:
        return None
    if "train" not in files:
        if len(files) > 1:
            raise ConfigError(f"dataset_name: {name_or_path!r} holds CoNLL files {sorted(files)} but none named train "
                              "(train.txt, train.conll, ...); name the training file train.<ext>.")
        files = {"train": next(iter(files.values()))}
    return files


def read_conll(paths: str | Sequence[str]) -> list[dict[str, Any]]:
    """The sentences of CoNLL files: ``[{"tokens": [...], "ner_tags": [...], "document": int}]``.

    The first column of a line is the word and the last its tag; a blank line ends a sentence; a ``-DOCSTART-``
    line ends the document (it is not a sentence). ``document`` counts the documents from 0 over all the files.

    Raises:
        ConfigError: a line with a word but no tag (its file and line number are named).
    """
    sentences: list[dict[str, Any]] = []
    document = 0
    for path in [paths] if isinstance(paths, str) else paths:
        tokens: list[str] = []
        tags: list[str] = []
        started = False  # a document opened by content, not by -DOCSTART-

        def close():
            nonlocal tokens, tags
            if tokens:
                sentences.append({"tokens": tokens, "ner_tags": tags, "document": document})
            tokens, tags = [], []

        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                fields = line.split()
                if not fields:
                    close()
                    continue
                if fields[0] == DOCSTART:
                    close()
                    if started:
                        document += 1
                    started = False
                    continue
                if len(fields) < 2:
                    raise ConfigError(f"dataset_name: line {number} of {path} has a word but no tag ({line.strip()!r});"
                                      " CoNLL lines are 'word TAG' (the tag last), a blank line between sentences.")
                started = True
                tokens.append(fields[0])
                tags.append(fields[-1])
        close()
        if started:
            document += 1
    return sentences


# -------------------------------------------------------------------------------------------------
# tags
# -------------------------------------------------------------------------------------------------
def _entity_type(tag: str) -> str:
    return tag.split("-", 1)[1] if "-" in tag and tag != "-X-" else tag


def tag_names(tags) -> list[str]:
    """The tag names for the string tags ``tags``: ``O`` first, then by entity type, ``B-`` before ``I-``."""
    found = set(tags)
    rest = sorted(found - {"O"}, key=lambda t: (_entity_type(t), t.split("-", 1)[0] if "-" in t else "", t))
    return (["O"] if "O" in found else []) + rest


def _inner_feature(feature):
    """The per-token feature of a sequence column (``Sequence(x)`` or ``List(x)``), else None."""
    return getattr(feature, "feature", None)


def encode_tags(splits: dict[str, datasets.Dataset], column: str) -> tuple[dict[str, datasets.Dataset], list[str]]:
    """Every split's tag column as ids, and the tag names (index = id): a ``Sequence(ClassLabel)`` keeps its own;
    string tags get :func:`tag_names` over every split (the same ids everywhere).

    Raises:
        ConfigError: not a column of tag sequences, or integer tags without names.
    """
    first = next(iter(splits.values()))
    inner = _inner_feature(first.features[column])
    if isinstance(inner, datasets.ClassLabel):
        return splits, list(inner.names)
    dtype = getattr(inner, "dtype", None)
    if dtype not in ("string", "large_string"):
        raise ConfigError(f"label_column: {column!r} holds {first.features[column]}; token classification needs a tag "
                          "sequence per sentence with its names: strings (B-PER, I-PER, O) or a Sequence(ClassLabel) "
                          "feature (class ids alone cannot be scored as entities).")
    names = tag_names(t for split in splits.values() for row in split[column] for t in row)
    ids = {name: i for i, name in enumerate(names)}
    feature = datasets.Sequence(datasets.ClassLabel(names=names))
    out = {}
    for name, split in splits.items():
        encoded = split.map(lambda batch: {column: [[ids[t] for t in row] for row in batch[column]]}, batched=True,
                            desc="encoding tags")
        out[name] = encoded.cast_column(column, feature)
    return out, names


def sentence_tag(tags: Sequence[str]) -> str:
    """The sentence's most frequent entity type (``B-``/``I-`` merged; on a tie the first to appear), ``O`` if none."""
    types = [_entity_type(t) for t in tags if t != "O"]
    if not types:
        return "O"
    counts = Counter(types)
    best = max(counts.values())
    return next(t for t in types if counts[t] == best)


# -------------------------------------------------------------------------------------------------
# tokenization and label alignment
# -------------------------------------------------------------------------------------------------
def align_labels(word_ids: Sequence[int | None], word_labels: Sequence[int], *, label_all_tokens: bool = False,
                 continuation: Sequence[int] | None = None) -> list[int]:
    """One label per sub-token: the word's label on its first sub-token; ``-100`` on the special tokens (word id
    None) and, unless ``label_all_tokens``, on the word's other sub-tokens (then ``continuation[label]``: the
    ``I-`` id of a ``B-`` label, the label itself otherwise)."""
    labels = []
    previous = None
    for word in word_ids:
        if word is None:
            labels.append(IGNORE_INDEX)
        elif word != previous:
            labels.append(int(word_labels[word]))
        elif label_all_tokens:
            label = int(word_labels[word])
            labels.append(int(continuation[label]) if continuation is not None else label)
        else:
            labels.append(IGNORE_INDEX)
        previous = word
    return labels


def continuation_ids(names: Sequence[str]) -> list[int]:
    """Per label id, the id its non-first sub-tokens get under ``label_all_tokens``: ``B-X`` -> ``I-X`` when that
    tag exists, every other label itself."""
    index = {name: i for i, name in enumerate(names)}
    return [index.get("I-" + name[2:], i) if name.startswith("B-") else i for i, name in enumerate(names)]


def tokenize_and_align(dataset: datasets.Dataset, tokenizer, *, label_names: Sequence[str], tokens_column: str = "tokens",
                       tags_column: str = "ner_tags", max_seq_length: int = 256, label_all_tokens: bool = False,
                       keep: Sequence[str] = ()) -> datasets.Dataset:
    """``input_ids`` / ``attention_mask`` (/ ``token_type_ids``) and aligned ``labels``; plus ``sentence_tag`` (a
    ``ClassLabel``); other columns dropped except ``keep``."""
    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError("model_name_or_path: token classification needs a fast tokenizer (it maps sub-words to "
                          "words); save the model with its tokenizer.json (AutoTokenizer's fast tokenizer).")
    names = list(label_names)
    continuation = continuation_ids(names)
    types = tag_names(["O", *(sentence_tag([n]) for n in names)])

    def encode(batch):
        words = [[str(w) for w in row] for row in batch[tokens_column]]
        encoded = tokenizer(words, is_split_into_words=True, truncation=True, max_length=max_seq_length)
        encoded["labels"] = [align_labels(encoded.word_ids(i), tags, label_all_tokens=label_all_tokens,
                                          continuation=continuation)
                             for i, tags in enumerate(batch[tags_column])]
        encoded[SENTENCE_TAG] = [types.index(sentence_tag([names[t] for t in tags])) for tags in batch[tags_column]]
        return encoded

    drop = [c for c in dataset.column_names if c not in keep]
    out = dataset.map(encode, batched=True, remove_columns=drop, desc="tokenizing")
    return out.cast_column(SENTENCE_TAG, datasets.ClassLabel(names=types))


@dataclass
class TokenClassificationCollator:
    """``DataCollatorForTokenClassification`` (labels padded with ``-100``) over the model's columns: the
    partition's ``sentence_tag`` stays out of the batch."""

    tokenizer: Any
    drop: tuple[str, ...] = (SENTENCE_TAG,)

    def __post_init__(self):
        from transformers import DataCollatorForTokenClassification

        self.collator = DataCollatorForTokenClassification(self.tokenizer, label_pad_token_id=IGNORE_INDEX)

    def __call__(self, features):
        return self.collator([{k: v for k, v in f.items() if k not in self.drop} for f in features])


# -------------------------------------------------------------------------------------------------
# the data of a run (hf_fedflat.data.hf_datasets reads the files and splits them, then calls this)
# -------------------------------------------------------------------------------------------------
def conll_dataset(files: dict[str, list[str]]) -> datasets.DatasetDict:
    """The sentences of :func:`conll_files`' splits (:func:`read_conll`), one ``DatasetDict`` split each."""
    return datasets.DatasetDict({split: datasets.Dataset.from_list(read_conll(paths)) for split, paths in files.items()})


def check_ner_columns(raw: datasets.DatasetDict, data_args: DataArguments) -> tuple[str, str]:
    """``(words column, tags column)``: ``--text_column`` / ``--label_column``, by default ``tokens`` /
    ``ner_tags``; refused naming the field when a split lacks one."""
    tokens_column = data_args.text_column or "tokens"
    tags_column = data_args.label_column or "ner_tags"
    for field_name, column in (("text_column", tokens_column), ("label_column", tags_column)):
        for split_name, split in raw.items():
            if column not in split.column_names:
                raise ConfigError(f"{field_name}: {column!r} is not a column of the {split_name!r} split (columns: "
                                  f"{', '.join(split.column_names)}); token classification reads the words and their "
                                  "tags per sentence (--text_column, --label_column).")
    return tokens_column, tags_column


def prepare_ner_data(train: datasets.Dataset, test: datasets.Dataset, data_args: DataArguments, processing_class, *,
                     task: str = "token-classification") -> dict[str, Any]:
    """The training and evaluation sentences tokenized and aligned for a token classification model (see the
    module doc).

    Returns the fields of a :class:`~hf_fedflat.data.catalog.FederatedData` but its name: the tokenized splits,
    the tag names (the model's labels), the collator, the metrics (entity F1,
    :mod:`hf_fedflat.metrics.sequence_labeling`), the partition label ``sentence_tag`` and, with
    ``--partition_by``, the natural-id partition.
    """
    from ..metrics.selection import trainer_metrics
    from .partition import natural_id_partition

    tokens_column, tags_column = check_ner_columns(datasets.DatasetDict({"train": train, "eval": test}), data_args)
    keep = [data_args.partition_by] if data_args.partition_by else []
    encoded, names = encode_tags({"train": train, "eval": test}, tags_column)
    options = dict(label_names=names, tokens_column=tokens_column, tags_column=tags_column,
                   max_seq_length=data_args.max_seq_length, label_all_tokens=data_args.label_all_tokens)
    train = tokenize_and_align(encoded["train"], processing_class, keep=keep, **options)
    test = tokenize_and_align(encoded["eval"], processing_class, **options).remove_columns(SENTENCE_TAG)
    if not len(train):
        raise ConfigError(f"dataset_name: no training sentences in {data_args.dataset_name!r}.")
    partition = None
    if data_args.partition_by:
        partition = natural_id_partition(train, data_args.partition_by, label_column=SENTENCE_TAG)
        train = train.remove_columns(data_args.partition_by)
    return dict(train=train, eval=test, num_classes=len(names), in_chans=0, label_column=SENTENCE_TAG, task=task,
                partition=partition, label_names=names, processing_class=processing_class,
                data_collator=TokenClassificationCollator(processing_class),
                **trainer_metrics(task, None, label_names=names))
