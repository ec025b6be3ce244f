"""Model cards that record the federated set-up of a run (``hf_fedflat.hub.card``): built from explicit inputs
(tags, set-up, a per-round table of at most ~10 lines, no token) and written beside a final model with its images."""

from __future__ import annotations

import re

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
