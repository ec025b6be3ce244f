"""A model and data that draw random numbers in the training step and in the batch fetch (``tests/runtime/``: the
lanes and the lean client loop must give the draws of one client at a time, and of the Trainer's loop)."""

from __future__ import annotations

import datasets
import torch
from torch import nn

from conftest import make_tiny_dataset


class DropoutClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 16), nn.Dropout(0.5), nn.Tanh(), nn.Linear(16, 3))

    def forward(self, x, labels=None):
        logits = self.net(x)
        return {"logits": logits, "loss": nn.functional.cross_entropy(logits, labels)}


def noisy_train_data() -> datasets.Dataset:
    plain = make_tiny_dataset(n=96, seed=1).with_format(None)
    table = datasets.Dataset.from_dict({"x": plain["x"], "labels": plain["labels"], "label": plain["label"]})

    def augment(batch):  # a random augmentation drawing from torch's global generator, as torchvision's do
        x = torch.tensor(batch["x"])
        return {"x": x + 0.3 * torch.randn(x.shape), "labels": torch.tensor(batch["labels"])}

    return table.with_transform(augment)
