"""Loss-landscape measurements (``hf_fedflat.diagnostics.landscape``): the filter-normalised random direction
has, filter by filter, the norms of the weights (and is 0 on biases)."""

from __future__ import annotations

import torch

from hf_fedflat import ParameterSpace
from hf_fedflat.diagnostics import filter_normalized_direction

from conftest import TinyClassifier


def test_filter_normalized_direction_matches_filter_norms():
    torch.manual_seed(0)
    space = ParameterSpace(TinyClassifier())
    params = space.flatten()
    direction = filter_normalized_direction(space, params, torch.Generator().manual_seed(1))
    for weight, d in zip(space.split(params), space.split(direction)):
        if weight.ndim < 2:
            assert torch.all(d == 0)
        else:
            torch.testing.assert_close(d.norm(dim=1), weight.norm(dim=1), rtol=1e-5, atol=1e-6)
