"""Final weights of every preset over 3 rounds are bit-identical to those recorded before the redesign.

The record (``tests/golden/weights_before_redesign.json``) was written by ``tests/golden/record_weights.py``
on the code as it was before the 2026-11 redesign; it is never regenerated to make this test pass.
"""

from __future__ import annotations

import json

import pytest

from golden.record_weights import RECORD, digest, final_weights, runs

with open(RECORD) as handle:
    RECORDED = json.load(handle)


def test_every_preset_and_combination_is_recorded():
    assert set(runs()) <= set(RECORDED)


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_final_weights_are_bit_identical_to_before_the_redesign(name):
    params = final_weights(runs()[name])
    expected = RECORDED[name]
    assert digest(params) == expected["sha256"], (
        f"{name}: norm {float(params.double().norm())!r} vs recorded {expected['norm']!r}, "
        f"first {params[:4].tolist()} vs {expected['first']}"
    )
