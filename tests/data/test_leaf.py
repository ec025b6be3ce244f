"""LEAF's JSON format (``hf_fedflat.data.leaf``): the reader and writer, malformed files refused naming the file,
contiguous partitions and the by-sample split.

The loaders of the LEAF datasets are tested beside their modules (``test_femnist.py``, ``test_celeba.py``,
``test_synthetic.py``, ``test_leaf_text.py``, ``test_shakespeare.py``); every dataset there is written by the
test in its real on-disk format, and the expected values are read back from those files with ``json``/plain
parsing, independently of the loaders (``helpers.leaf``).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from hf_fedflat.data.leaf import (
    LeafFormatError,
    contiguous_partition,
    iter_leaf_users,
    read_leaf,
    split_by_sample,
    write_leaf,
)


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
