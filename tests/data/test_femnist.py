"""FEMNIST (``hf_fedflat.data.femnist``), written by the test in LEAF's format and in the Hub copy's layout: one
client per writer with LEAF's samples, bad pixels, the cache, the partition of 3,400 writers."""

from __future__ import annotations

import json

import datasets
import numpy as np
import pytest
import torch
from PIL import Image

from hf_fedflat.data.leaf import LeafFormatError, contiguous_partition, write_leaf

from helpers.leaf import assert_complete_disjoint, users_from_json


@pytest.fixture(scope="module")
def femnist_dir(tmp_path_factory):
    from hf_fedflat.data.femnist import write_femnist_leaf

    return write_femnist_leaf(tmp_path_factory.mktemp("femnist"), num_writers=7, samples_per_writer=12, num_files=3)


def test_femnist_one_client_per_writer_with_leafs_samples(femnist_dir):
    from hf_fedflat.data.femnist import FEMNIST_CLASS_NAMES, femnist_from_leaf, femnist_transform

    clients = femnist_from_leaf(femnist_dir)
    for split, part in (("train", clients.partition), ("test", clients.test_partition)):
        expected = users_from_json(femnist_dir, split)
        table = clients.dataset[split]
        assert clients.users == list(expected)  # one client per writer, in file order
        assert part.num_samples == [count for _, _, count in expected.values()]
        assert_complete_disjoint(part, table.num_rows)
        rows = table.with_format("numpy")
        transform = femnist_transform()
        for client, (user, (x, y, _)) in enumerate(expected.items()):
            idx = part.client_indices[client]
            assert set(rows[idx]["writer_id"]) == {user} and set(rows[idx]["client_id"]) == {client}
            np.testing.assert_array_equal(rows[idx]["label"], y)
            np.testing.assert_array_equal(part.label_counts[client], np.bincount(y, minlength=62))
            batch = transform(table.select(idx)[:])  # pixel_values as LEAF stores them, 1.0 = white
            assert batch["pixel_values"].shape == (len(y), 1, 28, 28)
            torch.testing.assert_close(batch["pixel_values"].reshape(len(y), -1), torch.tensor(x, dtype=torch.float32),
                                       rtol=0, atol=1e-6)
    assert clients.partition.class_names == FEMNIST_CLASS_NAMES
    assert FEMNIST_CLASS_NAMES[:11] == list("0123456789A") and FEMNIST_CLASS_NAMES[36] == "a"
    grown = femnist_transform(image_size=32, in_chans=3)(clients.dataset["train"][:4])["pixel_values"]
    assert grown.shape == (4, 3, 32, 32) and 0.0 <= float(grown.min()) and float(grown.max()) <= 1.0


def test_femnist_max_clients_and_bad_pixels(femnist_dir, tmp_path):
    from hf_fedflat.data.femnist import femnist_from_leaf

    a = femnist_from_leaf(femnist_dir, max_clients=3, seed=5)
    b = femnist_from_leaf(femnist_dir, max_clients=3, seed=5)
    users = list(users_from_json(femnist_dir, "train"))
    assert a.users == b.users and len(a.users) == 3 and a.users == [u for u in users if u in a.users]
    assert a.dataset["test"].num_rows == sum(len(y) for u, (_, y, _) in users_from_json(femnist_dir, "test").items()
                                             if u in a.users)
    write_leaf(tmp_path, "train", {"w": ([[1.5] * 784], [3])})
    write_leaf(tmp_path, "test", {"w": ([[0.5] * 784], [3])})
    with pytest.raises(LeafFormatError, match=r"all_data_0_train.json: user 'w': x values must be in \[0, 1\]"):
        femnist_from_leaf(tmp_path)
    write_leaf(tmp_path, "train", {"w": ([[0.5] * 783], [3])})
    with pytest.raises(LeafFormatError, match="784 floats"):
        femnist_from_leaf(tmp_path)


def test_femnist_cache_is_reused_and_follows_the_files(tmp_path, monkeypatch):
    import hf_fedflat.data.femnist as femnist

    root = femnist.write_femnist_leaf(tmp_path / "leaf", num_writers=3, samples_per_writer=8, num_files=1)
    first = femnist.femnist_from_leaf(root)
    caches = list((root / "hf_fedflat_cache").iterdir())
    assert len(caches) == 1 and first.dataset["train"].cache_files  # memory-mapped from the cache

    def no_json(*args, **kwargs):
        raise AssertionError("the JSON files were read again")

    with monkeypatch.context() as patch:
        patch.setattr(femnist, "read_leaf", no_json)
        again = femnist.femnist_from_leaf(root)
    assert again.users == first.users and again.partition == first.partition
    assert again.test_partition == first.test_partition
    np.testing.assert_array_equal(np.asarray(again.dataset["train"].with_format("numpy")["pixels"]),
                                  np.asarray(femnist.femnist_from_leaf(root, cache=False).dataset["train"]
                                             .with_format("numpy")["pixels"]))
    path = next((root / "test").glob("*.json"))
    content = json.loads(path.read_text())
    user = content["users"][0]
    content["user_data"][user]["y"] = [61] * len(content["user_data"][user]["y"])
    path.write_text(json.dumps(content))  # a changed file: a new cache
    changed = femnist.femnist_from_leaf(root)
    assert changed.test_partition.label_counts[0, 61] == len(content["user_data"][user]["y"])
    assert len(list((root / "hf_fedflat_cache").iterdir())) == 2


def test_femnist_partition_for_3400_writers_is_contiguous_arrays():
    """FEMNIST's scale: 3,400 writers (a few samples each here) -> one table, 3,400 contiguous clients."""
    from hf_fedflat.data.femnist import FEMNIST_CLASS_NAMES, _grouped_split

    rng = np.random.default_rng(0)
    sizes = rng.integers(2, 8, 3400)
    rows = [(rng.integers(0, 256, (n, 784), dtype=np.uint8), rng.integers(0, 62, n)) for n in sizes]
    users = [f"f{i:04d}_00" for i in range(3400)]
    table = _grouped_split(users, rows, "train")
    labels = np.asarray(table.data.column("label").to_numpy())
    part = contiguous_partition(sizes, labels, FEMNIST_CLASS_NAMES)
    assert part.num_clients == 3400 and part.num_samples == sizes.tolist()
    assert_complete_disjoint(part, int(sizes.sum()))
    for c in (0, 1234, 3399):
        got = table.with_format("numpy")[part.client_indices[c]]
        np.testing.assert_array_equal(got["pixels"], rows[c][0])
        assert set(got["writer_id"]) == {users[c]}


def test_femnist_hub_layout_one_client_per_writer(tmp_path):
    from hf_fedflat.data.femnist import load_femnist

    rng = np.random.default_rng(1)
    counts = {"w2": 9, "w1": 5, "w3": 1}  # w3: one sample, dropped as LEAF does
    names = ["a", "B", "7", "z"]  # a Hub ClassLabel in another order than LEAF's
    writer, character, images = [], [], []
    for w, n in counts.items():
        for _ in range(n):
            writer.append(w)
            character.append(int(rng.integers(0, 4)))
            images.append(Image.fromarray(rng.integers(0, 256, (28, 28), dtype=np.uint8), mode="L"))
    flat = datasets.Dataset.from_dict(
        {"image": images, "writer_id": writer, "character": character},
        features=datasets.Features({"image": datasets.Image(), "writer_id": datasets.Value("string"),
                                    "character": datasets.ClassLabel(names=names)}))
    flat.save_to_disk(str(tmp_path / "hub"))
    clients = load_femnist(str(tmp_path / "hub"), seed=0)
    assert clients.users == ["w1", "w2"]
    assert clients.partition.num_samples == [max(1, int(0.9 * 5)), int(0.9 * 9)]
    assert clients.test_partition.num_samples == [5 - 4, 9 - 8]
    leaf_ids = {"a": 36, "B": 11, "7": 7, "z": 61}
    for split in ("train", "test"):
        table = clients.dataset[split]
        for row in table:
            original = [i for i, im in enumerate(images) if np.array_equal(np.asarray(im), np.asarray(row["image"]))]
            assert len(original) == 1 and writer[original[0]] == row["writer_id"]
            assert row["label"] == leaf_ids[names[character[original[0]]]]
