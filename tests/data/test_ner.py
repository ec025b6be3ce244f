"""Token classification data: CoNLL files and the Hub layout read, tags named, labels aligned to sub-words by hand."""

from __future__ import annotations

import datasets
import pytest

from hf_fedflat.data.arguments import DataArguments
from hf_fedflat.data.hf_datasets import load_hf_dataset
from hf_fedflat.data.ner import (
    SENTENCE_TAG,
    TokenClassificationCollator,
    align_labels,
    conll_files,
    continuation_ids,
    encode_tags,
    read_conll,
    sentence_tag,
    tag_names,
    tokenize_and_align,
)
from hf_fedflat.data.tiny_text import train_wordpiece_tokenizer, write_conll_data, write_tiny_model
from hf_fedflat.field_checks import ConfigError
from hf_fedflat.models.arguments import ModelArguments

CONLL = """-DOCSTART- -X- -X- O

EU NNP B-NP B-ORG
rejects VBZ B-VP O
German JJ B-NP B-MISC
call NN I-NP O

Peter NNP B-NP B-PER
Blackburn NNP I-NP I-PER

-DOCSTART- -X- -X- O

BRUSSELS NNP B-NP B-LOC
"""


def test_read_conll_takes_the_first_and_last_columns_and_counts_documents(tmp_path):
    path = tmp_path / "train.txt"
    path.write_text(CONLL, encoding="utf-8")
    assert read_conll(str(path)) == [
        {"tokens": ["EU", "rejects", "German", "call"], "ner_tags": ["B-ORG", "O", "B-MISC", "O"], "document": 0},
        {"tokens": ["Peter", "Blackburn"], "ner_tags": ["B-PER", "I-PER"], "document": 0},
        {"tokens": ["BRUSSELS"], "ner_tags": ["B-LOC"], "document": 1},
    ]
    bad = tmp_path / "bad.conll"
    bad.write_text("word B-PER\nlonely\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="^dataset_name: line 2 of .*bad.conll has a word but no tag"):
        read_conll(str(bad))


def test_conll_files_finds_splits_and_tells_plain_text_apart(tmp_path):
    (tmp_path / "train.txt").write_text(CONLL, encoding="utf-8")
    (tmp_path / "valid.txt").write_text(CONLL, encoding="utf-8")
    (tmp_path / "test.txt").write_text(CONLL, encoding="utf-8")
    assert conll_files(str(tmp_path)) == {"test": [str(tmp_path / "test.txt")], "train": [str(tmp_path / "train.txt")],
                                          "validation": [str(tmp_path / "valid.txt")]}
    prose = tmp_path / "story.txt"
    prose.write_text("Once upon a time there was a model.\nIt learned.\n", encoding="utf-8")
    assert conll_files(str(prose)) is None  # a causal LM's plain text stays plain text
    assert conll_files(str(tmp_path / "train.txt")) == {"train": [str(tmp_path / "train.txt")]}


def test_tag_names_sentence_tag_and_continuations():
    assert tag_names(["O", "I-PER", "B-LOC", "B-PER", "I-LOC"]) == ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"]
    assert sentence_tag(["O", "B-LOC", "B-PER", "I-PER", "O"]) == "PER"  # PER twice, LOC once
    assert sentence_tag(["B-LOC", "B-PER"]) == "LOC"  # a tie: the first to appear
    assert sentence_tag(["O", "O"]) == "O"
    assert continuation_ids(["O", "B-LOC", "I-LOC", "B-MISC"]) == [0, 2, 2, 3]  # no I-MISC: B-MISC stays


def test_align_labels_by_hand():
    # [CLS] ali ##ce visited ams ##terdam [SEP]: words 0, 0, 1, 2, 2; tags B-PER O B-LOC (ids 3 0 1)
    word_ids = [None, 0, 0, 1, 2, 2, None]
    assert align_labels(word_ids, [3, 0, 1]) == [-100, 3, -100, 0, 1, -100, -100]
    continuation = [0, 2, 2, 4, 4]  # O, B-LOC, I-LOC, B-PER, I-PER
    assert align_labels(word_ids, [3, 0, 1], label_all_tokens=True, continuation=continuation) == [
        -100, 3, 4, 0, 1, 2, -100]


def test_tokenize_and_align_with_a_wordpiece_tokenizer_and_the_collator():
    tokenizer = train_wordpiece_tokenizer()
    names = ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"]
    raw = datasets.Dataset.from_list([{"tokens": ["alice", "visited", "amsterdam"], "ner_tags": [3, 0, 1]},
                                      {"tokens": ["bob", "met", "eve"], "ner_tags": [3, 0, 3]}])
    out = tokenize_and_align(raw, tokenizer, label_names=names, max_seq_length=16)
    assert tokenizer.convert_ids_to_tokens(out[0]["input_ids"]) == ["[CLS]", "ali", "##ce", "visited", "ams",
                                                                    "##terdam", "[SEP]"]
    assert out[0]["labels"] == [-100, 3, -100, 0, 1, -100, -100]
    assert out.features[SENTENCE_TAG].names == ["O", "LOC", "PER"] and out[1][SENTENCE_TAG] == 2
    batch = TokenClassificationCollator(tokenizer)([out[0], out[1]])
    assert SENTENCE_TAG not in batch and batch["labels"].shape == batch["input_ids"].shape == (2, 7)
    assert batch["labels"][1].tolist() == [-100, 3, 0, 3, -100, -100, -100]  # padded with -100


def test_encode_tags_keeps_a_classlabel_and_names_string_tags():
    feature = datasets.Features({"tokens": datasets.Sequence(datasets.Value("string")),
                                 "ner_tags": datasets.Sequence(datasets.ClassLabel(names=["O", "B-X", "I-X"]))})
    hub = datasets.Dataset.from_dict({"tokens": [["a", "b"]], "ner_tags": [[1, 2]]}, features=feature)
    assert encode_tags({"train": hub}, "ner_tags")[1] == ["O", "B-X", "I-X"]
    strings = {"train": datasets.Dataset.from_dict({"tokens": [["a", "b"]], "ner_tags": [["I-Y", "O"]]}),
               "eval": datasets.Dataset.from_dict({"tokens": [["c"]], "ner_tags": [["B-Y"]]})}
    encoded, names = encode_tags(strings, "ner_tags")
    assert names == ["O", "B-Y", "I-Y"] and encoded["train"][0]["ner_tags"] == [2, 0]
    assert encoded["eval"][0]["ner_tags"] == [1]  # the same ids in every split
    ints = datasets.Dataset.from_dict({"tokens": [["a"]], "ner_tags": [[1]]})
    with pytest.raises(ConfigError, match="^label_column: 'ner_tags' holds"):
        encode_tags({"train": ints}, "ner_tags")


@pytest.fixture(scope="module")
def ner_model(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("ner") / "model", "bert_token_classification", num_labels=7,
                            tokenizer=train_wordpiece_tokenizer())


def test_conll_files_and_the_hub_layout_load_the_same_run_data(tmp_path, ner_model):
    folder = write_conll_data(tmp_path / "conll", train_sentences=24, test_sentences=8, sentences_per_document=6)
    model_args = ModelArguments(model_name_or_path=ner_model)
    data = load_hf_dataset(DataArguments(dataset_name=folder), model_args, seed=0)
    assert data["task"] == "token-classification" and data["label_names"] == ["O", "B-LOC", "I-LOC", "B-ORG", "I-ORG",
                                                                             "B-PER", "I-PER"]
    assert len(data["train"]) == 24 and len(data["eval"]) == 8 and data["label_column"] == SENTENCE_TAG
    assert SENTENCE_TAG not in data["eval"].column_names and data["partition"] is None
    assert data["name"] == "conll" and data["hub_id"] is None
    by_document = load_hf_dataset(DataArguments(dataset_name=folder, partition_by="document"), model_args, seed=0)
    assert [len(rows) for rows in by_document["partition"].client_indices] == [6, 6, 6, 6]
    # the same sentences in the Hub layout (a save_to_disk copy with a Sequence(ClassLabel) tag column)
    names = data["label_names"]
    rows = {split: [{"tokens": r["tokens"], "ner_tags": [names.index(t) for t in r["ner_tags"]]}
                    for r in read_conll(str(tmp_path / "conll" / f"{split}.txt"))] for split in ("train", "test")}
    features = datasets.Features({"tokens": datasets.Sequence(datasets.Value("string")),
                                  "ner_tags": datasets.Sequence(datasets.ClassLabel(names=names))})
    datasets.DatasetDict({s: datasets.Dataset.from_list(r, features=features) for s, r in rows.items()}).save_to_disk(
        str(tmp_path / "hub"))
    hub = load_hf_dataset(DataArguments(dataset_name=str(tmp_path / "hub")), model_args, seed=0)
    assert hub["label_names"] == names and hub["train"]["labels"] == data["train"]["labels"]
    with pytest.raises(ConfigError, match="^task: .* holds CoNLL files"):
        load_hf_dataset(DataArguments(dataset_name=folder), ModelArguments(model_name_or_path=ner_model,
                                                                            task="text-classification"), seed=0)
    with pytest.raises(ConfigError, match="^label_column: 'tags' is not a column of the '(train|test)' split"):
        load_hf_dataset(DataArguments(dataset_name=folder, label_column="tags"), model_args, seed=0)
