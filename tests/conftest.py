"""Shared fixtures: a tiny model and data on which every formula can be computed by hand."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import datasets  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402


class TinyClassifier(nn.Module):
    """A 2-layer MLP returning what ``Trainer`` expects (``loss`` and ``logits``)."""

    def __init__(self, in_features: int = 4, hidden: int = 5, num_classes: int = 3):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_features, hidden), nn.Tanh(), nn.Linear(hidden, num_classes))

    def forward(self, x, labels=None):
        logits = self.net(x)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = nn.functional.cross_entropy(logits, labels)
        return out


@pytest.fixture
def one_thread():
    """Tiny models: one intra-op thread (on a shared 2-core machine, two threads made a BERT step 30x slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def make_tiny_dataset(n: int = 8, in_features: int = 4, num_classes: int = 3, seed: int = 0) -> datasets.Dataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, in_features, generator=g)
    teacher = torch.randn(in_features, num_classes, generator=torch.Generator().manual_seed(99))
    labels = (x @ teacher).argmax(dim=1)  # learnable: a linear teacher labels the points
    ds = datasets.Dataset.from_dict({"x": x.tolist(), "labels": labels.tolist(), "label": labels.tolist()})
    return ds.with_format("torch", columns=["x", "labels"])


def tiny_loss(model: nn.Module, params: list[torch.Tensor], x, y) -> torch.Tensor:
    """Loss of ``model``'s architecture at explicit parameter values (for hand-computed gradients)."""
    names = [n for n, _ in model.named_parameters()]
    out = torch.func.functional_call(model, dict(zip(names, params)), (x,))
    return nn.functional.cross_entropy(out["logits"], y)


@pytest.fixture
def tiny_model():
    torch.manual_seed(0)
    return TinyClassifier()


@pytest.fixture
def tiny_data():
    return make_tiny_dataset()
