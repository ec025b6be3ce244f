"""Greedy generations from fixed prompts at each evaluation of a causal LM (``--generation_prompts``).

A number says how a language model improves; a few continuations show it. At every evaluation round the global
model continues each prompt greedily (no sampling, one beam, at most ``--generation_max_new_tokens`` new tokens,
stopping at the end-of-sequence token), one prompt at a time so no padding changes a continuation. The round's
record gets ``generations``: ``[{"prompt": ..., "completion": ...}, ...]`` (the completion without the prompt,
special tokens dropped) -- in ``history.json``, and as text in TensorBoard when ``report_to`` includes it. The
last record's are the final model's.

Greedy decoding draws no random numbers, and the model is put back in the mode it was in: a run's weights are
the same with or without generations.

>>> probe = GenerationProbe(tokenizer, ["The capital of France is"], max_new_tokens=8)
>>> probe(model)          # [{"prompt": "The capital of France is", "completion": " Paris ..."}]
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from ..field_checks import ConfigError

__all__ = ["GenerationProbe", "read_prompts"]


def read_prompts(prompts: Sequence[str] | None, prompts_file: str | None) -> list[str]:
    """The prompts given on the command line, then one per non-empty line of ``prompts_file`` (a ``\\n`` inside a
    line is a newline of the prompt)."""
    out = [str(p) for p in prompts or ()]
    if prompts_file:
        path = os.path.expanduser(prompts_file)
        if not os.path.isfile(path):
            raise ConfigError(f"generation_prompts_file: {prompts_file!r} is not a file; give a text file with one "
                              "prompt per line.")
        with open(path, encoding="utf-8") as f:
            out += [line.rstrip("\n").replace("\\n", "\n") for line in f if line.strip()]
    return out


class GenerationProbe:
    """Greedy continuations of ``prompts`` by a causal LM, with its ``tokenizer``.

    Args:
        tokenizer: the run's tokenizer (``processing_class``).
        prompts: the texts to continue, as the model sees them (add an instruction template yourself).
        max_new_tokens: most tokens generated per prompt.
    """

    def __init__(self, tokenizer, prompts: Sequence[str], max_new_tokens: int = 32):
        if not prompts:
            raise ConfigError("generation_prompts: no prompt given.")
        self.tokenizer = tokenizer
        self.prompts = [str(p) for p in prompts]
        self.max_new_tokens = int(max_new_tokens)

    def _config(self, model):
        from transformers import GenerationConfig

        eos = self.tokenizer.eos_token_id
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos
        # an explicit greedy config: a checkpoint's generation_config.json may ask for sampling
        return GenerationConfig(max_new_tokens=self.max_new_tokens, do_sample=False, num_beams=1, eos_token_id=eos,
                                pad_token_id=pad, bos_token_id=getattr(model.config, "bos_token_id", None))

    def __call__(self, model) -> list[dict[str, str]]:
        """``[{"prompt", "completion"}]`` of the weights ``model`` holds now."""
        was_training = model.training
        model.eval()
        device = next(model.parameters()).device
        config = self._config(model)
        out = []
        try:
            with torch.no_grad():
                for prompt in self.prompts:
                    encoded = self.tokenizer(prompt, return_tensors="pt").to(device)
                    generated = model.generate(input_ids=encoded["input_ids"],
                                               attention_mask=encoded["attention_mask"], generation_config=config)
                    new = generated[0, encoded["input_ids"].shape[1]:]
                    out.append({"prompt": prompt,
                                "completion": self.tokenizer.decode(new, skip_special_tokens=True)})
        finally:
            model.train(was_training)
        return out
