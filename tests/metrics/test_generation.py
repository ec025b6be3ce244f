"""Greedy generations from fixed prompts: the tokens a hand-written greedy loop picks, the model left as it was."""

from __future__ import annotations

import pytest
import torch

from hf_fedflat.data.tiny_text import write_tiny_model
from hf_fedflat.field_checks import ConfigError
from hf_fedflat.metrics.generation import GenerationProbe, read_prompts

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = write_tiny_model(tmp_path_factory.mktemp("gpt2") / "model", "gpt2")
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def greedy_by_hand(model, tokenizer, prompt: str, steps: int) -> str:
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    new = []
    with torch.no_grad():
        for _ in range(steps):
            next_id = int(model(torch.cat([ids, torch.tensor([new], dtype=ids.dtype)], dim=1)
                               if new else ids).logits[0, -1].argmax())
            if next_id == tokenizer.eos_token_id:
                break
            new.append(next_id)
    return tokenizer.decode(new, skip_special_tokens=True)


def test_generations_are_the_greedy_continuations(tiny_gpt2):
    model, tokenizer = tiny_gpt2
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    prompts = ["the movie was", "Give the opposite of the word hot ."]
    got = GenerationProbe(tokenizer, prompts, max_new_tokens=5)(model)
    assert [g["prompt"] for g in got] == prompts and all(g["completion"] for g in got)  # not vacuous
    model.eval()
    for entry in got:
        assert entry["completion"] == greedy_by_hand(model, tokenizer, entry["prompt"], 5)
    model.train()
    assert model.training  # put back in the mode it was in
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert GenerationProbe(tokenizer, prompts, max_new_tokens=5)(model) == got  # no randomness


def test_read_prompts_from_flags_and_a_file(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("first prompt\n\nsecond\\nline two\n", encoding="utf-8")
    assert read_prompts(["given"], str(path)) == ["given", "first prompt", "second\nline two"]
    assert read_prompts(None, None) == []
    with pytest.raises(ConfigError, match="^generation_prompts_file: "):
        read_prompts(None, str(tmp_path / "missing.txt"))
    with pytest.raises(ConfigError, match="^generation_prompts: "):
        GenerationProbe(None, [])
