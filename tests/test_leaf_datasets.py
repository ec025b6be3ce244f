"""LEAF's JSON format and the FEMNIST, CelebA, Synthetic and Tiny-ImageNet loaders.

Every dataset here is written by the test in its real on-disk format (LEAF ``train/``+``test/`` JSON, CelebA's
``raw/img_align_celeba`` JPEGs, the ``tiny-imagenet-200`` tree), and the expected values are read back from
those files with ``json``/plain parsing, independently of the loaders.
"""

from __future__ import annotations

import json
import math

import datasets
import numpy as np
import pytest
import torch
from PIL import Image

from hf_fedflat.data.leaf import (
    LeafFormatError,
    contiguous_partition,
    iter_leaf_users,
    read_leaf,
    split_by_sample,
    write_leaf,
)


def _users_from_json(root, split):
    """``{user: (x, y, num_samples)}`` read with ``json`` alone."""
    out = {}
    for path in sorted((root / split).glob("*.json")):
        content = json.loads(path.read_text())
        for user, count in zip(content["users"], content["num_samples"]):
            out[user] = (content["user_data"][user]["x"], content["user_data"][user]["y"], count)
    return out


def _assert_complete_disjoint(partition, num_rows):
    every = np.concatenate(partition.client_indices) if partition.num_clients else np.zeros(0, np.int64)
    np.testing.assert_array_equal(np.sort(every), np.arange(num_rows))


# ------------------------------------------------------------------------------------------- the reader
def test_leaf_round_trip_several_files_and_hierarchies(tmp_path):
    rng = np.random.default_rng(0)
    data = {f"u{i}": (rng.random((i + 2, 3)).round(4), list(range(i + 2))) for i in range(5)}
    write_leaf(tmp_path, "train", data, num_files=2, hierarchies={u: f"group{i % 2}" for i, u in enumerate(data)})
    write_leaf(tmp_path, "test", {u: (x[:1], y[:1]) for u, (x, y) in data.items()}, num_files=3)
    assert len(list((tmp_path / "train").glob("*.json"))) == 2 and len(list((tmp_path / "test").glob("*.json"))) == 3
    read = read_leaf(tmp_path)
    assert read.users == list(data) and read.split_by == "sample"
    for user, (x, y) in data.items():
        assert read.train[user] == (x.tolist(), y) and read.test[user] == (x[:1].tolist(), y[:1])
        assert read.num_samples["train"][user] == len(y) and read.num_samples["test"][user] == 1
    assert read.hierarchies == {"u0": "group0", "u1": "group1", "u2": "group0", "u3": "group1", "u4": "group0"}
    # LEAF's own tree: data/<dataset>/data/{train,test}
    nested = tmp_path / "femnist"
    write_leaf(nested / "data", "train", {"a": ([[1.0]], [0])})
    write_leaf(nested / "data", "test", {"a": ([[2.0]], [1])})
    assert read_leaf(nested).train == {"a": ([[1.0]], [0])}
    # convert runs per user; keep_users never converts the others
    seen = []
    kept = read_leaf(tmp_path, convert=lambda u, x, y: seen.append(u) or len(y), keep_users=lambda us: us[1:3])
    assert kept.train == {"u1": 3, "u2": 4} and kept.test == {"u1": 1, "u2": 1} and set(seen) == {"u1", "u2"}
    # the keep_users pass reads only the head of a file whose first key is users (LEAF's order), else all of it
    from hf_fedflat.data.leaf import _read_users

    broken = '{"users": ["p", "q"], "num_samples": [1, 1], "user_data": {BROKEN'
    head_only = _write_raw(tmp_path / "heads", "h.json", broken)
    assert _read_users(head_only) == ["p", "q"]
    other_order = _write_raw(tmp_path / "heads", "o.json", {"num_samples": [1], "users": ["r"],
                                                             "user_data": {"r": {"x": [[0]], "y": [0]}}})
    assert _read_users(other_order) == ["r"]
    many = [f"{i:064d}" for i in range(20_000)]  # the array runs past the first MiB: the whole file is parsed
    long = _write_raw(tmp_path / "heads", "l.json", {"users": many, "num_samples": [0] * len(many),
                                                     "user_data": {u: {"x": [], "y": []} for u in many}})
    assert _read_users(long) == many
    # split by user (LEAF --by_user): disjoint users are accepted and reported
    by_user = tmp_path / "by_user"
    write_leaf(by_user, "train", {"a": ([[0]], [0]), "b": ([[1]], [1])})
    write_leaf(by_user, "test", {"c": ([[2]], [0])})
    read = read_leaf(by_user)
    assert read.split_by == "user" and read.users == ["a", "b", "c"] and list(read.test) == ["c"]


def _write_raw(folder, name, content):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


GOOD = {"users": ["a"], "num_samples": [1], "user_data": {"a": {"x": [[0.5]], "y": [1]}}}


@pytest.mark.parametrize("content, message", [
    ("{not json", "not valid JSON"),
    ([1, 2], "JSON object"),
    ({"users": ["a"], "user_data": {"a": {"x": [], "y": []}}}, r"missing key\(s\) \['num_samples'\]"),
    ({"users": ["a", "b"], "num_samples": [1], "user_data": {}}, "2 users but 1 num_samples"),
    ({"users": ["a", "a"], "num_samples": [1, 1], "user_data": {"a": {"x": [[0]], "y": [0]}}}, "'a' is listed twice"),
    ({"users": ["a"], "num_samples": [1], "user_data": {"b": {"x": [[0]], "y": [0]}}}, r"in user_data only: \['b'\]"),
    ({"users": ["a"], "num_samples": [2], "user_data": {"a": {"x": [[0]], "y": [0]}}},
     r"'a' has num_samples 2 but len\(x\) = 1 and len\(y\) = 1"),
    ({"users": ["a"], "num_samples": [2], "user_data": {"a": {"x": [[0], [1]], "y": [0]}}},
     r"len\(x\) = 2 and len\(y\) = 1"),
    ({"users": ["a"], "num_samples": [1], "user_data": {"a": {"x": [[0]]}}}, "must be an object with x and y"),
    ({**GOOD, "hierarchies": ["h", "extra"]}, "hierarchies must be a list with one entry per user"),
])
def test_malformed_files_are_refused_naming_the_file(tmp_path, content, message):
    path = _write_raw(tmp_path / "train", "bad_3_train.json", content)
    _write_raw(tmp_path / "test", "ok_test.json", GOOD)
    with pytest.raises(LeafFormatError, match=message) as err:
        read_leaf(tmp_path)
    assert str(path) in str(err.value)


def test_inconsistent_users_duplicates_and_missing_folders(tmp_path):
    _write_raw(tmp_path / "train", "t0.json", GOOD)
    _write_raw(tmp_path / "train", "t1.json", GOOD)  # 'a' again in another file of the split
    _write_raw(tmp_path / "test", "s0.json", GOOD)
    with pytest.raises(LeafFormatError, match=r"t1.json: user 'a' is also in .*t0.json"):
        read_leaf(tmp_path)
    (tmp_path / "train" / "t1.json").unlink()
    two = {"users": ["a", "b"], "num_samples": [1, 1],
           "user_data": {"a": {"x": [[0]], "y": [0]}, "b": {"x": [[0]], "y": [0]}}}
    _write_raw(tmp_path / "test", "s0.json", {"users": ["a", "z"], "num_samples": [1, 1],
                                              "user_data": {"a": {"x": [[0]], "y": [0]}, "z": {"x": [[0]], "y": [0]}}})
    _write_raw(tmp_path / "train", "t0.json", two)
    with pytest.raises(LeafFormatError, match=r"only in train/ \(e.g. \['b'\]\) and 1 only in test/ \(e.g. \['z'\]\)"):
        read_leaf(tmp_path)
    with pytest.raises(FileNotFoundError, match="no train/ folder"):
        read_leaf(tmp_path / "test")
    (tmp_path / "test" / "s0.json").unlink()
    with pytest.raises(FileNotFoundError, match="no LEAF"):
        read_leaf(tmp_path)
    # LEAF Reddit states each user's total count in every split: accepted on request, x/y still matched
    mismatch = {"users": ["a"], "num_samples": [5], "user_data": {"a": {"x": [[0]], "y": [0]}}}
    _write_raw(tmp_path / "r" / "train", "r.json", mismatch)
    assert [u.num_samples for u in iter_leaf_users(tmp_path / "r", "train", check_num_samples=False)] == [5]
    with pytest.raises(LeafFormatError, match="num_samples 5"):
        list(iter_leaf_users(tmp_path / "r", "train"))


def test_contiguous_partition_and_split_by_sample():
    part = contiguous_partition([2, 0, 3], [0, 1, 1, 0, 2], ["a", "b", "c"])
    assert [p.tolist() for p in part.client_indices] == [[0, 1], [], [2, 3, 4]]
    np.testing.assert_array_equal(part.label_counts, [[1, 1, 0], [0, 0, 0], [1, 1, 1]])
    rng = np.random.default_rng(0)
    for n, expected in ((1, None), (2, 1), (3, 2), (10, 9), (11, 9), (226, 203)):
        split = split_by_sample(n, 0.9, rng)
        if expected is None:
            assert split is None
            continue
        train, test = split
        assert len(train) == expected == max(1, min(n - 1, int(0.9 * n)))
        np.testing.assert_array_equal(np.sort(np.concatenate([train, test])), np.arange(n))


# ------------------------------------------------------------------------------------------------ FEMNIST
@pytest.fixture(scope="module")
def femnist_dir(tmp_path_factory):
    from hf_fedflat.data.femnist import write_femnist_leaf

    return write_femnist_leaf(tmp_path_factory.mktemp("femnist"), num_writers=7, samples_per_writer=12, num_files=3)


def test_femnist_one_client_per_writer_with_leafs_samples(femnist_dir):
    from hf_fedflat.data.femnist import FEMNIST_CLASS_NAMES, femnist_from_leaf, femnist_transform

    clients = femnist_from_leaf(femnist_dir)
    for split, part in (("train", clients.partition), ("test", clients.test_partition)):
        expected = _users_from_json(femnist_dir, split)
        table = clients.dataset[split]
        assert clients.users == list(expected)  # one client per writer, in file order
        assert part.num_samples == [count for _, _, count in expected.values()]
        _assert_complete_disjoint(part, table.num_rows)
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
    users = list(_users_from_json(femnist_dir, "train"))
    assert a.users == b.users and len(a.users) == 3 and a.users == [u for u in users if u in a.users]
    assert a.dataset["test"].num_rows == sum(len(y) for u, (_, y, _) in _users_from_json(femnist_dir, "test").items()
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
    _assert_complete_disjoint(part, int(sizes.sum()))
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


# ------------------------------------------------------------------------------------------------- CelebA
def test_celeba_one_client_per_celebrity_and_image_errors(tmp_path):
    from hf_fedflat.data.celeba import celeba_from_leaf, write_celeba_leaf

    root = write_celeba_leaf(tmp_path / "celeba", num_celebrities=4, images_per_celebrity=6)
    clients = celeba_from_leaf(root)
    for split, part in (("train", clients.partition), ("test", clients.test_partition)):
        expected = _users_from_json(root, split)
        assert clients.users == list(expected) and part.num_samples == [c for _, _, c in expected.values()]
        table = clients.dataset[split]
        _assert_complete_disjoint(part, table.num_rows)
        raw = table.cast_column("image", datasets.Image(decode=False))
        for client, (user, (x, y, _)) in enumerate(expected.items()):
            idx = part.client_indices[client]
            folder = root / "raw" / "img_align_celeba"
            assert [r["path"] for r in raw.select(idx)["image"]] == [str(folder / n) for n in x]
            assert list(table.select(idx)["label"]) == y and set(table.select(idx)["celeb_id"]) == {user}
    assert table[0]["image"].size == (178, 218)
    first = _users_from_json(root, "train")
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


# ---------------------------------------------------------------------------------------------- Synthetic
def test_synthetic_follows_its_construction():
    from hf_fedflat.data.synthetic import generate_synthetic

    K = 200
    clients, p = generate_synthetic(0.5, 1.0, num_users=K, seed=3)
    again, _ = generate_synthetic(0.5, 1.0, num_users=K, seed=3)
    other, _ = generate_synthetic(0.5, 1.0, num_users=K, seed=4)
    assert all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) for a, b in zip(clients, again))
    assert not np.array_equal(clients[0][0][:5], other[0][0][:5])
    sizes = np.array([len(y) for _, y in clients])
    np.testing.assert_array_equal(sizes, p.sizes)
    assert sizes.min() >= 50 and 30 < np.median(sizes - 50) < 100  # floor(lognormal(4, 2)): median e^4 = 54.6
    np.testing.assert_allclose(p.sigma_diag, np.arange(1, 61) ** -1.2)
    # u_k ~ N(0, alpha), B_k ~ N(0, beta): their spread over 200 clients
    assert abs(p.u.std() - 0.5) < 0.1 and abs(p.B.std() - 1.0) < 0.2 and abs(p.u.mean()) < 0.15
    # W_k, b_k ~ N(u_k, 1) and v_k ~ N(B_k, 1) entrywise
    for centred in (p.W - p.u[:, None, None], p.b - p.u[:, None], p.v - p.B[:, None]):
        assert abs(centred.mean()) < 0.05 and abs(centred.std() - 1.0) < 0.05
    # x ~ N(v_k, Sigma): every client's sample mean within 5.5 standard errors of v_k, pooled variance = j^-1.2
    squares = np.zeros(60)
    for k, (x, y) in enumerate(clients):
        x = x.astype(np.float64)
        assert np.all(np.abs(x.mean(0) - p.v[k]) < 5.5 * np.sqrt(p.sigma_diag / len(x)))
        squares += ((x - p.v[k]) ** 2).sum(0)
        # y = argmax softmax(x W_k + b_k) (x stored as float32: at most a tie-level flip)
        assert np.mean(np.argmax(x @ p.W[k] + p.b[k], axis=1) == y) > 0.99
    np.testing.assert_allclose(squares / sizes.sum(), p.sigma_diag, rtol=0.05)
    zero, q = generate_synthetic(0.0, 0.0, num_users=5, seed=0)
    assert not q.u.any() and not q.B.any()
    _, iid = generate_synthetic(1.0, 1.0, num_users=5, iid=True, seed=0)
    assert not iid.v.any() and all(np.array_equal(iid.W[0], w) for w in iid.W)


def test_synthetic_clients_split_and_arguments(tmp_path):
    from hf_fedflat.data.arguments import DataArguments
    from hf_fedflat.data.synthetic import generate_synthetic, synthetic_clients, synthetic_from_leaf, \
        write_synthetic_leaf

    clients = synthetic_clients(1.0, 1.0, num_users=6, seed=2)
    data, _ = generate_synthetic(1.0, 1.0, num_users=6, seed=2)
    assert clients.partition.num_samples == [int(0.9 * len(y)) for _, y in data]
    assert clients.test_partition.num_samples == [len(y) - int(0.9 * len(y)) for _, y in data]
    first = clients.dataset["train"].with_format("numpy")[clients.partition.client_indices[1]]
    np.testing.assert_array_equal(first["features"], data[1][0][: int(0.9 * len(data[1][1]))])
    leaf = synthetic_from_leaf(write_synthetic_leaf(tmp_path, num_users=6, seed=2))
    assert leaf.users == clients.users and leaf.partition.num_samples == clients.partition.num_samples
    np.testing.assert_allclose(np.asarray(leaf.dataset["test"]["features"]),
                               np.asarray(clients.dataset["test"]["features"]), rtol=1e-6)
    for field, value in (("synthetic_alpha", -1.0), ("synthetic_beta", float("nan")), ("synthetic_num_users", 0)):
        with pytest.raises(ValueError, match=f"^{field}: must be"):
            DataArguments(**{field: value})


# ------------------------------------------------------------------------------------------ Tiny-ImageNet
def test_tiny_imagenet_val_annotations_and_class_names(tmp_path):
    from hf_fedflat.data.tiny_imagenet import load_tiny_imagenet, write_tiny_imagenet

    base = write_tiny_imagenet(tmp_path, num_classes=4, train_per_class=3, val_per_class=2, size=16)
    data, names = load_tiny_imagenet("zh-plus/tiny-imagenet", data_dir=str(tmp_path))  # the folder above
    wnids = (base / "wnids.txt").read_text().split()
    assert data["train"].features["label"].names == wnids and names == [f"thing {c}" for c in range(4)]
    raw = data["test"].cast_column("image", datasets.Image(decode=False))
    annotations = [line.split("\t")[:2] for line in (base / "val" / "val_annotations.txt").read_text().splitlines()]
    assert [(r["image"]["path"].rsplit("/", 1)[1], wnids[r["label"]]) for r in raw] == [tuple(a) for a in annotations]
    train = data["train"].cast_column("image", datasets.Image(decode=False))
    assert all(r["image"]["path"].split("/")[-3] == wnids[r["label"]] for r in train) and train.num_rows == 12
    lines = (base / "val" / "val_annotations.txt").read_text().splitlines()
    (base / "val" / "val_annotations.txt").write_text("\n".join(lines[:2] + ["val_2.JPEG\tn99999999\t0\t0\t1\t1"]))
    with pytest.raises(ValueError, match=r"val_annotations.txt:3: class 'n99999999' of val_2.JPEG is not in wnids.txt"):
        load_tiny_imagenet(data_dir=str(base))
    (base / "words.txt").write_text(f"{wnids[0]}\tsame\n{wnids[1]}\tsame, other\n")
    (base / "val" / "val_annotations.txt").write_text("\n".join(lines))
    assert load_tiny_imagenet(data_dir=str(base))[1][:3] == [f"same ({wnids[0]})", f"same ({wnids[1]})", wnids[2]]
    (base / "val" / "images" / "val_0.JPEG").unlink()
    with pytest.raises(FileNotFoundError, match=r"1 image\(s\) of .*val_annotations.txt are not in"):
        load_tiny_imagenet(data_dir=str(base))


def test_tiny_imagenet_hub_layout_valid_is_the_test_split(tmp_path):
    from hf_fedflat.data.tiny_imagenet import load_tiny_imagenet

    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["n1", "n2"])})
    make = lambda n: datasets.Dataset.from_dict({"image": [Image.new("RGB", (64, 64))] * n, "label": [0, 1] * (n // 2)},
                                                features=features)
    datasets.DatasetDict({"train": make(4), "valid": make(2)}).save_to_disk(str(tmp_path / "hub"))
    data, names = load_tiny_imagenet(str(tmp_path / "hub"))
    assert data["train"].num_rows == 4 and data["test"].num_rows == 2 and names == ["n1", "n2"]


# ----------------------------------------------------------------------------------- --smoke, 2 rounds each
@pytest.mark.parametrize("name, model, extra", [
    ("femnist", "small_cnn", {}),
    ("celeba", "small_cnn", {}),
    ("synthetic", "logistic", {"image_size": 1}),
    ("tiny_imagenet", "small_cnn", {}),
])
def test_smoke_two_rounds_offline(tmp_path, name, model, extra):
    from hf_fedflat import FedTrainingArguments
    from hf_fedflat.data.arguments import DataArguments
    from hf_fedflat.cli.experiment import build_experiment
    from hf_fedflat.models.arguments import ModelArguments

    args = FedTrainingArguments(output_dir=str(tmp_path), use_cpu=True, num_rounds=2, num_clients=4,
                                clients_per_round=2, local_steps=2, per_device_train_batch_size=4, disable_tqdm=True,
                                report_to=[])
    experiment = build_experiment(DataArguments(dataset_name=name, smoke=True),
                                  ModelArguments(model_name=model, image_size=extra.get("image_size", 16)), args)
    partition = experiment.data.partition
    if name != "tiny_imagenet":  # the natural clients (the users of the written LEAF files) set num_clients
        files = (tmp_path / "smoke_data" / name).glob("train/*.json")
        written = sum(len(json.loads(p.read_text())["users"]) for p in files)
        assert experiment.args.num_clients == partition.num_clients == written
    experiment.trainer.train()
    history = experiment.trainer.history
    assert [r["round"] for r in history] == [1, 2] and all(math.isfinite(r["eval_loss"]) for r in history)
    assert (tmp_path / "final_model" / "config.json").is_file()


def test_synthetic_needs_image_size_one_and_cli_smoke(tmp_path):
    from hf_fedflat.cli import main
    from hf_fedflat.data.arguments import DataArguments
    from hf_fedflat.data.catalog import load_data
    from hf_fedflat.models.arguments import ModelArguments

    with pytest.raises(ValueError, match=r"^image_size: synthetic's samples are vectors .* pass --image_size 1"):
        load_data(DataArguments(dataset_name="synthetic"), ModelArguments(model_name="logistic"), seed=0)
    assert main(["train", "--dataset_name", "synthetic", "--smoke", "--model_name", "logistic", "--image_size", "1",
                 "--num_rounds", "2", "--clients_per_round", "2", "--local_steps", "2", "--output_dir", str(tmp_path),
                 "--use_cpu", "true", "--disable_tqdm", "true", "--report_to", "none"]) == 0
    history = json.loads((tmp_path / "history.json").read_text())
    rounds = history["rounds"] if isinstance(history, dict) else history
    assert [r["round"] for r in rounds if "round" in r][-1] == 2
