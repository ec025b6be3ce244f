"""CelebA (``hf_fedflat.data.celeba``), written by the test (LEAF's JSON and ``raw/img_align_celeba`` JPEGs, or a
Hub copy's rows): one client per celebrity, image errors, the user column of a Hub copy."""

from __future__ import annotations

import datasets
import numpy as np
import pytest
from PIL import Image

from hf_fedflat.data.leaf import LeafFormatError, write_leaf

from helpers.leaf import assert_complete_disjoint, users_from_json


def test_celeba_one_client_per_celebrity_and_image_errors(tmp_path):
    from hf_fedflat.data.celeba import celeba_from_leaf, write_celeba_leaf

    root = write_celeba_leaf(tmp_path / "celeba", num_celebrities=4, images_per_celebrity=6)
    clients = celeba_from_leaf(root)
    for split, part in (("train", clients.partition), ("test", clients.test_partition)):
        expected = users_from_json(root, split)
        assert clients.users == list(expected) and part.num_samples == [c for _, _, c in expected.values()]
        table = clients.dataset[split]
        assert_complete_disjoint(part, table.num_rows)
        raw = table.cast_column("image", datasets.Image(decode=False))
        for client, (user, (x, y, _)) in enumerate(expected.items()):
            idx = part.client_indices[client]
            folder = root / "raw" / "img_align_celeba"
            assert [r["path"] for r in raw.select(idx)["image"]] == [str(folder / n) for n in x]
            assert list(table.select(idx)["label"]) == y and set(table.select(idx)["celeb_id"]) == {user}
    assert table[0]["image"].size == (178, 218)
    first = users_from_json(root, "train")
    (root / "raw" / "img_align_celeba" / next(iter(first.values()))[0][0]).unlink()
    with pytest.raises(FileNotFoundError, match=r"1 image\(s\) named in train/\*.json are not in"):
        celeba_from_leaf(root)
    write_leaf(tmp_path / "bad", "train", {"c": (["000001.jpg"], [2])})
    write_leaf(tmp_path / "bad", "test", {"c": (["000001.jpg"], [1])})
    (tmp_path / "bad" / "raw" / "img_align_celeba").mkdir(parents=True)
    with pytest.raises(LeafFormatError, match="user 'c': y must be 0 or 1"):
        celeba_from_leaf(tmp_path / "bad")


def test_partition_by_names_the_user_column_of_a_hub_copy(tmp_path):
    from hf_fedflat.data.arguments import DataArguments
    from hf_fedflat.data.catalog import load_data
    from hf_fedflat.models.arguments import ModelArguments

    ids = ["x"] * 6 + ["y"] * 5 + ["z"] * 4
    flat = datasets.Dataset.from_dict({"image": [Image.new("RGB", (8, 8))] * len(ids), "person": ids,
                                       "Smiling": [i % 2 for i in range(len(ids))]},
                                      features=datasets.Features({"image": datasets.Image(),
                                                                  "person": datasets.Value("string"),
                                                                  "Smiling": datasets.Value("int64")}))
    flat.save_to_disk(str(tmp_path / "hub"))
    data = load_data(DataArguments(dataset_name="celeba", dataset_path=str(tmp_path / "hub"), partition_by="person"),
                     ModelArguments(), seed=0)
    assert data.partition.num_clients == 2 and data.partition.num_samples == [5, 4]  # z has 4 images: dropped
    with pytest.raises(ValueError, match=r"'celeb_id' is not a column of the dataset \(columns: .*'person'"):
        load_data(DataArguments(dataset_name="celeba", dataset_path=str(tmp_path / "hub")), ModelArguments(), seed=0)
    with pytest.raises(ValueError, match="^partition_by: a LEAF folder names its users itself"):
        load_data(DataArguments(dataset_name="femnist", smoke=True, smoke_dir=str(tmp_path), partition_by="w"),
                  ModelArguments(), seed=0)
    with pytest.raises(ValueError, match="^partition_by: applies to Hub/local datasets"):
        load_data(DataArguments(dataset_name="synthetic", partition_by="user"), ModelArguments(image_size=1), seed=0)


def test_celeba_hub_layout_keeps_celebrities_with_five_images():
    from hf_fedflat.data.celeba import celeba_from_rows

    rng = np.random.default_rng(0)
    counts = {"10": 7, "11": 4, "12": 5}
    ids = [c for c, n in counts.items() for _ in range(n)]
    smiling = rng.integers(0, 2, len(ids)).astype(bool)
    flat = datasets.Dataset.from_dict({"image": [Image.new("RGB", (4, 4))] * len(ids), "celeb_id": ids,
                                       "Smiling": smiling},
                                      features=datasets.Features({"image": datasets.Image(),
                                                                  "celeb_id": datasets.Value("string"),
                                                                  "Smiling": datasets.Value("bool")}))
    clients = celeba_from_rows(flat)
    assert clients.users == ["10", "12"]  # "11" has 4 images: LEAF keeps celebrities with >= 5
    assert clients.partition.num_samples == [6, 4] and clients.test_partition.num_samples == [1, 1]
    train = clients.dataset["train"]
    positions = [i for i, c in enumerate(ids) if c in ("10", "12")]
    labels = list(train["label"]) + list(clients.dataset["test"]["label"])
    assert sorted(labels) == sorted(smiling[positions].astype(int).tolist())
