"""Expected values of LEAF-format folders read back with ``json`` alone, independently of the loaders."""

from __future__ import annotations

import json

import numpy as np


def users_from_json(root, split):
    """``{user: (x, y, num_samples)}`` read with ``json`` alone."""
    out = {}
    for path in sorted((root / split).glob("*.json")):
        content = json.loads(path.read_text())
        for user, count in zip(content["users"], content["num_samples"]):
            out[user] = (content["user_data"][user]["x"], content["user_data"][user]["y"], count)
    return out


def assert_complete_disjoint(partition, num_rows):
    """Every row of the split is in exactly one client."""
    every = np.concatenate(partition.client_indices) if partition.num_clients else np.zeros(0, np.int64)
    np.testing.assert_array_equal(np.sort(every), np.arange(num_rows))
