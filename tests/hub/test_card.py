"""Model cards that record the federated set-up of a run (``hf_fedflat.hub.card``): built from explicit inputs
(tags, set-up, a per-round table of at most ~10 lines, no token) and written beside a final model with its images."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from huggingface_hub import ModelCard

from hf_fedflat.hub import build_model_card, write_model_card
from hf_fedflat.models import create_model

from helpers.hub import ALGORITHM, ARGS, SENTINEL, make_history, make_partition, write_run


def table_rounds(text: str, heading: str = "## Metrics per round") -> list[int]:
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    return [int(m.group(1)) for m in re.finditer(r"^\| (\d+) \|", section, flags=re.M)]


def test_card_from_explicit_inputs():
    history = make_history(30)
    card = build_model_card(ARGS, history=history, algorithm=ALGORITHM, partition=make_partition(), dataset_name="digits",
                            dataset_id="user/digits", base_model="timm/some-model", max_table_rows=10)
    data = card.data
    assert data.tags[:4] == ["federated-learning", "hf-fedflat", "fedsam", "sam"]
    assert data.datasets == ["user/digits"] and data.base_model == "timm/some-model"
    assert data.eval_results[0].metric_value == pytest.approx(history[-1]["eval_accuracy"], abs=1e-6)
    text = card.text
    for expected in ("`rho=0.1`", "20 (5 per round, 25% participation)", "`dirichlet(alpha=0.3)`, seed 42",
                     "28 in total; min 4 / median 7 / max 10", "lr 0.05 x 0.998^round", "batch size 16", "1 epoch per round (mean 4 steps)",
                     "| best accuracy | 0.9500 |", "| best round | 18 |", "Qu et al."):
        assert expected in text, expected
    # 30 rounds into at most ~10 lines: every 5th round (k = ceil(30 / 7)), the first, the best (18) and the last
    assert table_rounds(text) == [1, 5, 10, 15, 18, 20, 25, 30]
    assert SENTINEL not in str(card)
    assert table_rounds(str(build_model_card(ARGS, history=history[:6], algorithm=ALGORITHM))) == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("flags, row", [({}, "fp32"), ({"bf16": True}, "bf16"),
                                        ({"fp16": True, "use_cpu": True}, "fp32 (--fp16 has no effect on CPU)"),
                                        ({"fp16": True, "use_cpu": False}, "fp16")])
def test_card_precision_is_what_the_run_trained_in(flags, row):
    """--fp16 on a CPU run trains in fp32 (CUDA's float16 autocast is not applied): the card says so."""
    card = build_model_card({**ARGS, "fp16": False, "bf16": False, **flags}, history=make_history(30), algorithm=ALGORITHM)
    assert f"| precision | {row} |" in card.text


def test_written_card_reloads_with_its_images(tmp_path):
    torch.manual_seed(0)
    final = write_run(tmp_path, create_model("small_cnn", 3, in_chans=1, image_size=8))
    path = write_model_card(final, ARGS, dataset_name="digits")
    card = ModelCard.load(path)
    assert card.data.library_name == "transformers"
    assert card.data.eval_results[0].dataset_name == "digits"
    for image in ("partition_heatmap.png", "training_curves.png"):
        assert f"]({image})" in card.text
        assert (final / image).read_bytes().startswith(b"\x89PNG")
    assert "load_model(" in card.text and "small_cnn" in card.text
    assert "aggregator `mean`" in card.text  # the algorithm comes from federated_config.json


# ------------------------------------------------------------------------------------------------
# metrics by task: whatever eval_* keys the history has, "best" by the task's metric, no empty column or plot
# ------------------------------------------------------------------------------------------------
def _metadata(card) -> dict:
    from huggingface_hub import metadata_load

    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "README.md"
        path.write_text(str(card))
        return metadata_load(path)


def _columns(text: str) -> list[str]:
    section = text.split("## Metrics per round", 1)[1]
    header = next(line for line in section.splitlines() if line.startswith("| round"))
    return [c.strip() for c in header.strip("|").split("|")]


def test_classifier_card_shows_every_metric_the_history_has():
    history = [dict(r, eval_f1_macro=r["eval_accuracy"] - 0.1, eval_runtime=0.5) for r in make_history(30)[:6]]
    card = build_model_card(ARGS, history=history, algorithm=ALGORITHM, partition=make_partition(),
                            dataset_name="digits", task="image-classification")
    assert _columns(card.text) == ["round", "train_loss", "eval_loss", "eval_accuracy", "eval_f1_macro", "round_seconds"]
    meta = _metadata(card)
    assert meta["metrics"] == ["accuracy", "f1_macro"]
    results = {m["type"]: m["value"] for r in meta["model-index"][0]["results"] for m in r["metrics"]}
    # the last round's values (round 6: accuracy 0.2 + 0.6 (1 - e^-1) = 0.579272..., f1 0.1 less)
    assert results["accuracy"] == pytest.approx(0.2 + 0.6 * (1 - np.exp(-1)), abs=1e-6)
    assert results["f1_macro"] == pytest.approx(0.1 + 0.6 * (1 - np.exp(-1)), abs=1e-6)
    assert "| final f1 macro |" in card.text and "| classes per client |" in card.text
    assert "eval_runtime" not in card.text  # a timing, not a metric


def test_lora_causal_lm_card_has_perplexity_and_lora_settings_and_no_accuracy():
    # perplexity falls 40, 30, 20, 25: the best (lowest) is round 3
    history = [{"round": r, "train_loss": 4.0 - r / 2, "eval_loss": math.log(p), "eval_perplexity": p,
                "round_seconds": 1.0} for r, p in zip((1, 2, 3, 4), (40.0, 30.0, 20.0, 25.0))]
    lora = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "lora_dropout": 0.1, "target_modules": ["c_attn"],
            "modules_to_save": None}
    card = build_model_card({**ARGS, "partition_scheme": "iid"}, history=history, algorithm=ALGORITHM,
                            partition=make_partition(), dataset_name="tiny_lm", task="causal-lm", lora=lora,
                            base_model="openai-community/gpt2", layout="peft", run_config="run_config.yaml")
    text = card.text
    assert "accuracy" not in text and "classes per client" not in text
    assert "| LoRA | r 4, alpha 8, dropout 0.1, target modules `c_attn` |" in text
    assert "| best perplexity | 20.0000 |" in text and "| best round | 3 |" in text
    assert "| final perplexity | 25.0000 |" in text
    assert _columns(text) == ["round", "train_loss", "eval_loss", "eval_perplexity", "round_seconds"]
    meta = _metadata(card)
    assert meta["base_model"] == "openai-community/gpt2" and meta["pipeline_tag"] == "text-generation"
    assert meta["metrics"] == ["perplexity"]
    assert meta["model-index"][0]["results"][0]["metrics"][0]["value"] == 25.0
    assert "hf-fedflat train --config run_config.yaml" in text and "run.yaml" not in text.replace("run_config.yaml", "")


def test_token_classifier_card_reports_entity_f1():
    history = [{"round": r, "train_loss": 1.0 / r, "eval_loss": 1.1 / r, "eval_f1": f, "eval_precision": f,
                "eval_recall": f, "eval_accuracy": 0.9} for r, f in ((1, 0.3), (2, 0.6), (3, 0.5))]
    card = build_model_card(ARGS, history=history, algorithm=ALGORITHM, dataset_name="tiny_ner",
                            task="token-classification")
    assert "| best f1 | 0.6000 |" in card.text and "| best round | 2 |" in card.text
    assert "classes per client" not in card.text
    meta = _metadata(card)
    assert meta["pipeline_tag"] == "token-classification" and meta["metrics"][0] == "f1"
    assert "Reproduce" in card.text and "run_config.yaml" in card.text  # says none was written


def test_written_causal_lm_card_plots_only_what_was_recorded(tmp_path):
    from hf_fedflat.hub import plot_metrics

    history = [{"round": r, "train_loss": 3.0 / r, "eval_perplexity": 30.0 / r} for r in (1, 2, 3)]
    assert plot_metrics([{"round": 1}], tmp_path / "none.png") is None and not (tmp_path / "none.png").exists()
    assert plot_metrics(history, tmp_path / "curves.png").read_bytes().startswith(b"\x89PNG")
    from hf_fedflat.hub.card import _metric_panels

    assert _metric_panels(history) == {"loss": ["train_loss"], "perplexity": ["eval_perplexity"]}
