"""Synthetic(alpha, beta) (``hf_fedflat.data.synthetic``): its construction, its clients' split and arguments,
the image_size it needs and its ``--smoke`` run from the command line."""

from __future__ import annotations

import json

import numpy as np
import pytest


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
