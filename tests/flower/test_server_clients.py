"""The ServerApp's side of the round loop (``FlowerClients``): which stored state each client starts from, and every
reply that must not be aggregated left out with its reason while the others are."""

from __future__ import annotations

import json
import os
import types

import pytest
import torch

from helpers.flower import final_weights, max_difference, run_in_process

pytest.importorskip("flwr")

from hf_fedflat.flower.packing import pack, unpack  # noqa: E402
from hf_fedflat.flower.server_clients import FlowerClients  # noqa: E402


def test_state_rounds_are_the_last_aggregated_ones_overall_and_up_to_the_last_checkpoint():
    history = [{"round": 1, "num_clients": 2, "clients": [0, 2]},
               {"round": 2, "num_clients": 1, "clients": [2]},
               {"round": 3, "num_clients": 0, "clients": [], "round_failed": "refused"},
               {"round": 4, "num_clients": 2, "clients": [0, 1]},
               {"round": 5, "num_clients": 1, "clients": [1]}]
    trainer = types.SimpleNamespace(history=history, args=types.SimpleNamespace(save_every_n_rounds=2))
    clients = FlowerClients(grid=None)
    # the last checkpoint is round 4 (rounds 2 and 4 saved); client 0: aggregated in rounds 1 and 4
    assert clients._state_rounds(trainer, 0) == (4, 4)
    assert clients._state_rounds(trainer, 1) == (5, 4)
    assert clients._state_rounds(trainer, 2) == (2, 2)
    assert clients._state_rounds(trainer, 3) == (0, 0)  # never aggregated: the empty state
    trainer.args.save_every_n_rounds = 0  # no checkpoint: a restart starts over, from no state
    assert clients._state_rounds(trainer, 1) == (5, 0)


def _rewrite(reply, change):
    """The reply with its packed update passed through ``change(tensors) -> tensors``."""
    from flwr.app import Array

    config = reply.content["config"]
    tensors = {k: v.clone() for k, v in unpack(reply.content["arrays"]["update"].numpy(), config["layout"]).items()}
    array, layout = pack(change(tensors))
    reply.content["arrays"]["update"] = Array(array)
    config["layout"] = layout
    return reply


def _set(key, value):
    def change(tensors):
        tensors[key] = value(tensors)
        return tensors
    return change


BROKEN_REPLIES = {
    "nan_delta": (_set("0/delta", lambda t: torch.full_like(t["0/delta"], float("nan"))),
                  "update contains NaN or Inf"),
    "short_delta": (_set("0/delta", lambda t: t["0/delta"][:-1]), "malformed reply: delta is torch.float32"),
    "float64_delta": (_set("0/delta", lambda t: t["0/delta"].double()), "malformed reply: delta is torch.float64"),
    "other_client": (_set("0/meta", lambda t: torch.tensor([0, 5, 3])), "malformed reply: the update of client 0"),
    "no_steps": (_set("0/meta", lambda t: torch.tensor([2, 5, 0])), "trained 0 steps on 5 samples"),
    "infinite_loss": (_set("0/scalars", lambda t: torch.tensor([float("inf"), 1.0], dtype=torch.float64)),
                      "training loss is inf"),
    "state_sent": (_set("0/state/smoo/mu", lambda t: torch.zeros(3)),
                   "malformed reply: it carries the client's state"),
    "missing_message": (lambda t: {k: v for k, v in t.items() if "/msg/" not in k},
                        "malformed reply: its messages [] differ from the algorithm's"),
    "no_update": (lambda t: {}, "malformed reply: 0 updates, expected 1"),
}


@pytest.mark.parametrize("case", sorted(BROKEN_REPLIES))
def test_a_broken_reply_is_left_out_with_its_reason_and_the_round_goes_on(tmp_path, case):
    """Client 2's round-2 reply is broken (FedSMOO: its upload holds the update and the piece's message mu_i, its
    state mu_i stays on the node): round 2 aggregates clients 0 and 1 and records why client 2 is not in it; the final
    model equals the run in which client 2's reply never came."""
    change, reason = BROKEN_REPLIES[case]

    def tamper(reply, client, round_index):
        return _rewrite(reply, change) if (round_index, client) == (1, 2) else reply

    changes = {"fed_algorithm": "fedsmoo", "num_rounds": 3}
    output, _ = run_in_process(tmp_path / "broken", {"tamper": tamper}, **changes)
    with open(os.path.join(output, "history.json")) as f:
        records = json.load(f)
    assert [r["clients"] for r in records] == [[0, 1, 2], [0, 1], [0, 1, 2]]
    (failed,) = records[1]["failed_clients"]
    assert failed["client"] == 2 and failed["reason"].startswith(reason), failed["reason"]
    absent, _ = run_in_process(tmp_path / "absent", {"absent": lambda r, c: (r, c) == (1, 2)}, **changes)
    assert max_difference(final_weights(absent), final_weights(output)) == 0.0


def test_a_reply_that_is_not_an_update_at_all_is_left_out(tmp_path):
    def tamper(reply, client, round_index):
        if (round_index, client) == (0, 1):
            reply.content["config"]["layout"] = json.dumps({"nbytes": 3, "entries": []})
        return reply

    output, _ = run_in_process(tmp_path, {"tamper": tamper})
    with open(os.path.join(output, "history.json")) as f:
        first = json.load(f)[0]
    assert first["clients"] == [0, 2]
    assert first["failed_clients"][0]["reason"].startswith("malformed reply: ValueError: the layout describes 3 bytes")


def test_a_client_without_a_node_is_left_out_every_round(tmp_path):
    """Two nodes for three clients: client 2 is never reached, and each round says so."""
    output, grid = run_in_process(tmp_path, {"node_config": lambda i: {"num-partitions": 3}}, num_clients=3,
                                  clients_per_round=3, _nodes=2)
    with open(os.path.join(output, "history.json")) as f:
        records = json.load(f)
    for record in records:
        assert record["clients"] == [0, 1]
        assert record["failed_clients"] == [{"client": 2, "reason": "no SuperNode with partition-id=2 is connected"}]
    # each node said which client it is once, then got one train message per round
    assert sorted(grid.sent) == sorted([(1000, "query"), (1001, "query")] + [(n, "train") for n in (1000, 1001)] * 2)


def test_a_decentralized_preset_is_refused_before_anything_loads(tmp_path):
    from hf_fedflat.field_checks import ConfigError

    with pytest.raises(ConfigError, match=r"^fed_algorithm: 'dfedavg' is decentralized"):
        run_in_process(tmp_path, {}, fed_algorithm="dfedavg")
    assert not os.path.exists(tmp_path / "flower")


def _image_folder(root, seed: int, rows_per_class: int) -> str:
    """A CIFAR-layout image folder (train/<class>/*.png, test/<class>/*.png) of random 32x32 images."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    for split, count in (("train", rows_per_class), ("test", 2)):
        for label in ("airplane", "automobile", "bird"):
            os.makedirs(os.path.join(root, split, label), exist_ok=True)
            for i in range(count):
                pixels = rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(os.path.join(root, split, label, f"{i}.png"))
    return str(root)


def test_nodes_with_their_own_data_train_every_row_of_it(tmp_path):
    """Each node's data-path is a folder of its own (5, 6 and 7 images per class): its client trains on all of it,
    and the server evaluates on its own copy."""
    sizes = {0: 5, 1: 6, 2: 7}
    folders = {i: _image_folder(tmp_path / f"site{i}", i, n) for i, n in sizes.items()}
    server_data = _image_folder(tmp_path / "server", 9, 2)
    from hf_fedflat.flower import node

    changes = {"dataset_name": "cifar10", "data_dir": server_data, "image_size": 32, "per_device_train_batch_size": 4,
               "partition_scheme": "iid"}
    output, grid = run_in_process(tmp_path, {"node_config": lambda i: {"data-path": folders[i]}}, **changes)
    with open(os.path.join(output, "history.json")) as f:
        records = json.load(f)
    assert [r["clients"] for r in records] == [[0, 1, 2], [0, 1, 2]]
    # one local epoch of ceil(3 n / 4) steps per client: the node's every row, and no other
    assert records[0]["local_steps"] == pytest.approx(sum(-(-3 * n // 4) for n in sizes.values()) / 3)
    for i, n in sizes.items():
        experiment = next(e for k, e in node._EXPERIMENTS.items() if dict(k[1])["data_path"] == folders[i])
        assert experiment.trainer.partition.num_samples == [3 * n if c == i else 0 for c in range(3)]
