"""Instruction and plain-text data for a causal LM (``hf_fedflat.data.hf_datasets``): the response-only labels,
the templated prompt masked exactly, plain text trained on every token; evaluation splits never train unless named."""

from __future__ import annotations

import datasets
import pytest

from hf_fedflat.field_checks import ConfigError
from hf_fedflat.data.hf_datasets import build_instruction_features, split_train_eval, tokenize_instructions
from hf_fedflat.data.tiny_text import train_word_tokenizer


def test_instruction_features_label_the_response_only():
    row = build_instruction_features([5, 6, 7], [8, 9], eos_id=2, max_seq_length=10)
    assert row == {"input_ids": [5, 6, 7, 8, 9, 2], "attention_mask": [1] * 6, "labels": [-100, -100, -100, 8, 9, 2]}
    cut = build_instruction_features([5, 6, 7], [8, 9], eos_id=2, max_seq_length=4)
    assert cut["input_ids"] == [5, 6, 7, 8] and cut["labels"] == [-100, -100, -100, 8]
    assert build_instruction_features([5, 6, 7], [8, 9], eos_id=2, max_seq_length=3) is None  # no response left


def test_tokenize_instructions_masks_exactly_the_templated_prompt():
    tokenizer = train_word_tokenizer("gpt")
    data = datasets.Dataset.from_list([
        {"instruction": "Give the opposite of the word .", "input": "hot", "output": "cold"},
        {"instruction": "Repeat the colours .", "input": "", "output": "red blue"},
        {"instruction": "Repeat the colours .", "input": "red", "output": "red " * 200},
    ])
    out, dropped = tokenize_instructions(data, tokenizer, max_seq_length=40, prompt_template="Q: {instruction} {input} A:")
    assert dropped == 0 and len(out) == 3
    prompt = tokenizer("Q: Give the opposite of the word . hot A:")["input_ids"]
    first = out[0]
    assert first["input_ids"] == prompt + [tokenizer.convert_tokens_to_ids("cold"), tokenizer.eos_token_id]
    assert first["labels"] == [-100] * len(prompt) + first["input_ids"][len(prompt):]
    assert len(out[2]["input_ids"]) == 40 and out[2]["labels"][-1] != -100  # truncated inside the response
    # Alpaca's default template: without an input its second form; a prompt longer than max_seq_length is dropped
    alpaca, dropped = tokenize_instructions(data, tokenizer, max_seq_length=30)
    assert dropped == 2 and len(alpaca) == 1  # the two prompts with an input are 44 and 41 tokens
    long, _ = tokenize_instructions(data.select([1]), tokenizer, max_seq_length=200)
    text = tokenizer.decode(long[0]["input_ids"])
    assert "### Input" not in text and "### Response" in text


def test_plain_text_for_a_causal_lm_trains_on_every_token():
    from hf_fedflat.data.hf_datasets import tokenize_text

    tokenizer = train_word_tokenizer("gpt")
    data = datasets.Dataset.from_dict({"text": ["the movie was great", "", "red " * 50], "user": ["a", "b", "c"]})
    out = tokenize_text(data, tokenizer, text_column="text", max_seq_length=8, keep=["user"])
    assert set(out.column_names) == {"user", "input_ids", "attention_mask", "labels"}
    assert out["user"] == ["a", "c"]  # the empty text (only an EOS: nothing to predict) is dropped
    first = out[0]
    assert first["input_ids"] == tokenizer("the movie was great")["input_ids"] + [tokenizer.eos_token_id]
    assert first["labels"] == first["input_ids"] and len(out[1]["input_ids"]) == 8


@pytest.mark.parametrize("splits, message", [
    (["test"], "train_split: the dataset holds the split(s) test and no 'train' split;"),
    (["validation", "test"], "train_split: the dataset holds the split(s) validation, test and no 'train' split;"),
])
def test_a_dataset_of_evaluation_splits_alone_is_never_trained_on(splits, message):
    data = datasets.DatasetDict({name: datasets.Dataset.from_dict({"text": ["a", "b"], "label": [0, 1]})
                                 for name in splits})
    with pytest.raises(ConfigError) as refused:
        split_train_eval(data)
    assert str(refused.value).startswith(message)


def test_the_only_split_trains_when_it_is_not_an_evaluation_split():
    data = datasets.DatasetDict({"reviews": datasets.Dataset.from_dict({"text": list("abcdefghij"), "label": [0] * 10})})
    train, held, source = split_train_eval(data, test_fraction=0.2, seed=0)
    assert (len(train), len(held), source) == (8, 2, "0.2 of 'reviews' held out (seed 0)")
