"""The diagnostics' options (``hf_fedflat.diagnostics.arguments``): a measurement the run cannot make, or one
that does not exist, names the field."""

from __future__ import annotations

import pytest

from hf_fedflat import FedTrainingArguments


@pytest.mark.parametrize("overrides, field", [
    (dict(fed_algorithm="fedgh", clients_per_round=1), "clients_per_round"),
    (dict(fed_algorithm="fedavg", diagnostics="perturbation_drift"), "diagnostics"),
    (dict(diagnostics="sharpness,bogus"), "diagnostics"),
])
def test_diagnostics_configuration_errors(tmp_path, overrides, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        FedTrainingArguments(output_dir=str(tmp_path), use_cpu=True, num_clients=4, **overrides)
