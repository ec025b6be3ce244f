"""A node's client states by round: in a state folder (files) or in the records the ClientApp keeps."""

from __future__ import annotations

import pytest
import torch

from hf_fedflat.flower.node_state import NodeStates


@pytest.fixture(params=["folder", "records"])
def states(request, tmp_path):
    return NodeStates(str(tmp_path / "states"), None) if request.param == "folder" else NodeStates(None, {})


def test_a_state_is_read_back_exactly_under_its_round(states):
    c = torch.tensor([1.5, -2.0, 3.25], dtype=torch.float64)
    states.put(4, 2, {"scaffold": {"c_i": c}, "lesam": {"w_old": torch.arange(3, dtype=torch.bfloat16)}})
    got = states.get(4, 2)
    assert torch.equal(got["scaffold"]["c_i"], c) and got["scaffold"]["c_i"].dtype == torch.float64
    assert torch.equal(got["lesam"]["w_old"], torch.arange(3, dtype=torch.bfloat16))
    assert states.get(4, 0) == {}  # before any round: the empty state (the pieces start from their own init)
    assert states.get(4, 1) is None  # never stored here: the node says it does not hold it
    assert states.get(5, 2) is None


def test_keep_deletes_every_other_round_of_that_client_only(states):
    for round_number in (1, 2, 3, 5):
        states.put(0, round_number, {"p": {"x": torch.full((2,), float(round_number))}})
    states.put(1, 1, {"p": {"x": torch.zeros(2)}})
    states.keep(0, {2, 5})
    assert states.rounds(0) == [2, 5] and states.rounds(1) == [1]
    assert torch.equal(states.get(0, 5)["p"]["x"], torch.full((2,), 5.0))


def test_a_folder_keeps_the_states_for_the_next_process(tmp_path):
    NodeStates(str(tmp_path), None).put(2, 3, {"p": {"x": torch.ones(4)}})
    assert sorted(p.name for p in (tmp_path / "client-2").iterdir()) == ["round-3.safetensors"]
    assert torch.equal(NodeStates(str(tmp_path), None).get(2, 3)["p"]["x"], torch.ones(4))
