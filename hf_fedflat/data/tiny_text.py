"""Tiny offline text data, tokenizers and transformers models: the text recipes' ``--smoke``, tests, benchmarks.

Everything is built here, with no Hub access, in the formats a real run reads:

* :func:`write_sentiment_data` -- a ``save_to_disk`` ``DatasetDict`` shaped like ``stanfordnlp/imdb`` (``text``,
  ``label`` a ``ClassLabel`` ``neg``/``pos``, ``train``/``test`` splits) plus a ``user_id`` column (for
  ``--partition_by``); or, with ``fmt="csv"``/``"jsonl"``, files ``train.<ext>``/``test.<ext>`` with string labels.
* :func:`write_instruction_data` -- ``alpaca_data.json``, a JSON list of ``{"instruction", "input", "output"}``
  rows as in the Alpaca repository (``tatsu-lab/alpaca`` has the same columns).
* :func:`train_word_tokenizer` -- a word-level ``PreTrainedTokenizerFast`` trained on the data's words and the
  Alpaca template's (BERT-style or GPT-style special tokens).
* :func:`write_tiny_model` -- a random-init ``BertForSequenceClassification``, ``BertForTokenClassification``,
  ``GPT2LMHeadModel`` or ``LlamaForCausalLM`` (hidden 32, 2 layers) saved with its tokenizer: a
  ``--model_name_or_path`` folder.
* :func:`write_conll_data` -- NER sentences as CoNLL files (``train.txt``/``test.txt``: ``word TAG`` lines,
  ``-DOCSTART-`` between documents), and :func:`train_wordpiece_tokenizer`, a BERT-style tokenizer that splits
  the longer entity words into sub-words (so the label alignment has work to do).

The sentiment rows carry their label in their words (positive or negative adjectives among neutral ones), and the
instruction rows ask for a word's opposite or for a short list repeated: a tiny model learns both in a few rounds.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from ..field_checks import ConfigError

__all__ = [
    "NEGATIVE_WORDS",
    "OPPOSITES",
    "POSITIVE_WORDS",
    "instruction_rows",
    "sentiment_rows",
    "train_word_tokenizer",
    "write_instruction_data",
    "write_sentiment_data",
    "write_tiny_model",
    "ner_sentences",
    "train_wordpiece_tokenizer",
    "write_conll_data",
]

POSITIVE_WORDS = ("great", "wonderful", "good", "loved", "fun", "brilliant", "charming", "superb")
NEGATIVE_WORDS = ("bad", "awful", "terrible", "boring", "hated", "dull", "poor", "weak")
NEUTRAL_WORDS = ("the", "movie", "film", "was", "a", "story", "with", "and", "acting", "plot", "music", "end", "it",
                 "i", "this", "cast")
OPPOSITES = (("hot", "cold"), ("big", "small"), ("up", "down"), ("day", "night"), ("fast", "slow"),
             ("old", "new"), ("light", "dark"), ("open", "closed"), ("high", "low"), ("early", "late"))
COLOURS = ("red", "blue", "green", "yellow", "black", "white")


def sentiment_rows(n: int, seed: int = 0, num_users: int = 5, label_noise: float = 0.0) -> list[dict]:
    """``n`` rows ``{"text", "label" ("neg"/"pos"), "user_id"}``: 6-10 words, 1-3 of them carrying the label; a
    ``label_noise`` share of the rows has the other label (a ceiling below 100% accuracy)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        positive = rng.random() < 0.5
        cue = POSITIVE_WORDS if positive else NEGATIVE_WORDS
        words = [rng.choice(NEUTRAL_WORDS) for _ in range(rng.randint(4, 7))]
        for _ in range(rng.randint(1, 3)):
            words.insert(rng.randrange(len(words) + 1), rng.choice(cue))
        if rng.random() < label_noise:
            positive = not positive
        rows.append({"text": " ".join(words), "label": "pos" if positive else "neg",
                     "user_id": f"user_{rng.randrange(num_users)}"})
    return rows


def instruction_rows(n: int, seed: int = 0) -> list[dict]:
    """``n`` Alpaca-style rows: "Give the opposite of the word." / input ``hot`` / output ``cold``, or "Repeat the
    colours." / input ``red blue`` / output ``red blue`` (the input empty for a third of the opposites)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        if rng.random() < 0.6:
            a, b = rng.choice(OPPOSITES)
            if rng.random() < 0.5:
                a, b = b, a
            if rng.random() < 0.33:
                rows.append({"instruction": f"Give the opposite of the word {a} .", "input": "", "output": b})
            else:
                rows.append({"instruction": "Give the opposite of the word .", "input": a, "output": b})
        else:
            colours = " ".join(rng.choice(COLOURS) for _ in range(rng.randint(2, 4)))
            rows.append({"instruction": "Repeat the colours .", "input": colours, "output": colours})
    return rows


def write_sentiment_data(root: str | os.PathLike, *, train_rows: int = 96, test_rows: int = 32, seed: int = 0,
                         fmt: str = "save_to_disk", num_users: int = 5, label_noise: float = 0.0) -> str:
    """Write the sentiment data under ``root`` (see the module doc); returns the ``--dataset_name`` path."""
    import datasets

    root = Path(root)
    splits = {"train": sentiment_rows(train_rows, seed, num_users, label_noise),
              "test": sentiment_rows(test_rows, seed + 1, num_users, label_noise)}
    if fmt == "save_to_disk":
        features = datasets.Features({"text": datasets.Value("string"),
                                      "label": datasets.ClassLabel(names=["neg", "pos"]),
                                      "user_id": datasets.Value("string")})
        data = datasets.DatasetDict({
            name: datasets.Dataset.from_list([{**r, "label": ["neg", "pos"].index(r["label"])} for r in rows],
                                             features=features)
            for name, rows in splits.items()})
        data.save_to_disk(str(root))
        return str(root)
    root.mkdir(parents=True, exist_ok=True)
    for name, rows in splits.items():
        if fmt == "csv":
            import csv

            with open(root / f"{name}.csv", "w", newline="", encoding="utf-8") as f:
                writer = csv.DictWriter(f, fieldnames=["text", "label", "user_id"])
                writer.writeheader()
                writer.writerows(rows)
        elif fmt == "jsonl":
            (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        else:
            raise ConfigError(f"fmt: save_to_disk, csv or jsonl, got {fmt!r}")
    return str(root)


def write_instruction_data(root: str | os.PathLike, *, rows: int = 120, seed: int = 0) -> str:
    """``root/alpaca_data.json`` (a JSON list, as Alpaca ships it); returns the file's path."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    path = root / "alpaca_data.json"
    path.write_text(json.dumps(instruction_rows(rows, seed), indent=1), encoding="utf-8")
    return str(path)


def _corpus() -> list[str]:
    from .hf_datasets import ALPACA_TEMPLATE, ALPACA_TEMPLATE_NO_INPUT

    words = [*POSITIVE_WORDS, *NEGATIVE_WORDS, *NEUTRAL_WORDS, *COLOURS, *(w for pair in OPPOSITES for w in pair)]
    corpus = [" ".join(words), "Give the opposite of the word . Repeat the colours . user_0 user_1"]
    corpus += [ALPACA_TEMPLATE.format(instruction="", input=""), ALPACA_TEMPLATE_NO_INPUT.format(instruction="")]
    return corpus


def train_word_tokenizer(style: str = "gpt", corpus: list[str] | None = None, model_max_length: int = 128):
    """A word-level tokenizer trained on ``corpus`` (default: the smoke data's words and Alpaca's template).

    ``style="bert"``: ``[PAD] [UNK] [CLS] [SEP] [MASK]`` and ``[CLS] a [SEP]`` framing; ``"gpt"``: ``<pad> <unk>
    <eos>`` with ``<eos>`` also the BOS token (not added by the tokenizer, as GPT-2's)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = _corpus() if corpus is None else corpus
    if style not in ("bert", "gpt"):
        raise ConfigError(f"style: bert or gpt, got {style!r}")
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] if style == "bert" else ["<pad>", "<unk>", "<eos>"]
    tok = Tokenizer(models.WordLevel(unk_token=specials[1]))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(corpus, trainers.WordLevelTrainer(special_tokens=specials))
    if style == "bert":
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
            special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
        return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                       sep_token="[SEP]", mask_token="[MASK]", model_max_length=model_max_length)
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", eos_token="<eos>",
                                   bos_token="<eos>", model_max_length=model_max_length)


def write_tiny_model(path: str | os.PathLike, architecture: str = "bert", *, num_labels: int = 2, seed: int = 0,
                     hidden_size: int = 32, num_layers: int = 2, tokenizer=None) -> str:
    """A random-init tiny model (``architecture``: ``bert`` sequence classifier, ``bert_token_classification``,
    ``gpt2`` or ``llama`` causal LM)
    and its tokenizer (default :func:`train_word_tokenizer`) saved in ``path``; returns the path."""
    import torch
    import transformers

    if architecture not in ("bert", "bert_token_classification", "gpt2", "llama"):
        raise ConfigError(f"architecture: bert, bert_token_classification, gpt2 or llama, got {architecture!r}")
    tokenizer = tokenizer or train_word_tokenizer("bert" if architecture.startswith("bert") else "gpt")
    common = dict(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
    if architecture.startswith("bert"):
        config = transformers.BertConfig(hidden_size=hidden_size, num_hidden_layers=num_layers, num_attention_heads=2,
                                         intermediate_size=2 * hidden_size, max_position_embeddings=256,
                                         num_labels=num_labels, **common)
        cls = (transformers.BertForSequenceClassification if architecture == "bert"
               else transformers.BertForTokenClassification)
    elif architecture == "gpt2":
        config = transformers.GPT2Config(n_embd=hidden_size, n_layer=num_layers, n_head=2, n_positions=256,
                                         bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
                                         **common)
        cls = transformers.GPT2LMHeadModel
    else:
        config = transformers.LlamaConfig(hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                                          num_hidden_layers=num_layers, num_attention_heads=2, num_key_value_heads=2,
                                          max_position_embeddings=256, bos_token_id=tokenizer.eos_token_id,
                                          eos_token_id=tokenizer.eos_token_id, **common)
        cls = transformers.LlamaForCausalLM
    torch.manual_seed(seed)
    model = cls(config)
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return os.fspath(path)


# --- token classification (NER) -------------------------------------------------------------------
NER_ENTITIES = {
    "PER": (("alice",), ("bob", "marley"), ("carol",), ("dave", "johnson"), ("eve",), ("frank", "underwood")),
    "LOC": (("paris",), ("amsterdam",), ("new", "york"), ("berlin",), ("rotterdam",), ("san", "francisco")),
    "ORG": (("acme",), ("globex", "corporation"), ("initech",), ("umbrella", "corporation"), ("hooli",)),
}
NER_FILLERS = ("yesterday", "today", "the", "team", "met", "visited", "said", "that", "in", "with", "and", "a",
               "report", "from", "about", "left", "joined", "near")


def ner_sentences(n: int, seed: int = 0) -> list[tuple[list[str], list[str]]]:
    """``n`` sentences ``(words, IOB2 tags)``: 4-8 filler words with 1-3 entities (one or two words, each of the
    ``PER``/``LOC``/``ORG`` lists); the words alone tell the tags, so a tiny model learns them in a few rounds."""
    rng = random.Random(seed)
    sentences = []
    for _ in range(n):
        words = [rng.choice(NER_FILLERS) for _ in range(rng.randint(4, 8))]
        tags = ["O"] * len(words)
        for _ in range(rng.randint(1, 3)):
            kind = rng.choice(sorted(NER_ENTITIES))
            entity = list(rng.choice(NER_ENTITIES[kind]))
            at = rng.randrange(len(words) + 1)
            words[at:at] = entity
            tags[at:at] = [f"B-{kind}"] + [f"I-{kind}"] * (len(entity) - 1)
        sentences.append((words, tags))
    return sentences


def write_conll_data(root: str | os.PathLike, *, train_sentences: int = 96, test_sentences: int = 32,
                     sentences_per_document: int = 8, seed: int = 0) -> str:
    """``root/train.txt`` and ``root/test.txt`` in CoNLL format (``word TAG``, a blank line between sentences,
    ``-DOCSTART- -X- -X- O`` before every ``sentences_per_document`` sentences); returns ``root``."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for name, n, offset in (("train", train_sentences, 0), ("test", test_sentences, 1)):
        lines = []
        for i, (words, tags) in enumerate(ner_sentences(n, seed + offset)):
            if i % sentences_per_document == 0:
                lines += ["-DOCSTART- -X- -X- O", ""]
            lines += [f"{w} {t}" for w, t in zip(words, tags)] + [""]
        (root / f"{name}.txt").write_text("\n".join(lines), encoding="utf-8")
    return str(root)


def train_wordpiece_tokenizer(model_max_length: int = 128):
    """A BERT-style WordPiece tokenizer over the NER words: filler words whole, every entity word of more than
    four letters as its first three letters plus ``##`` continuations (``amsterdam`` -> ``ams ##terdam``)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = list(specials) + list(NER_FILLERS) + ["."]
    for entities in NER_ENTITIES.values():
        for entity in entities:
            for word in entity:
                pieces = [word] if len(word) <= 4 else [word[:3], "##" + word[3:]]
                vocab += [p for p in pieces if p not in vocab]
    tok = Tokenizer(models.WordPiece({w: i for i, w in enumerate(vocab)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
    from tokenizers import decoders

    tok.decoder = decoders.WordPiece()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]", model_max_length=model_max_length)
