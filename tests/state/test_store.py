"""The client-state store: memory, disk and auto (spilling) hold the same states and train the same model."""

from __future__ import annotations

import torch

from hf_fedflat.state import (
    AutoClientStateStore,
    DiskClientStateStore,
    InMemoryClientStateStore,
)

from helpers.runs import run


def state(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"scaffold": {"c_i": torch.randn(7, generator=g)}, "lesam": {"round": torch.tensor(seed)}}


def test_stores_round_trip_and_export(tmp_path):
    stores = [InMemoryClientStateStore(), DiskClientStateStore(tmp_path / "disk"),
              AutoClientStateStore(tmp_path / "auto", memory_budget_bytes=100)]
    for store in stores:
        assert store.get(3) == {}
        for client_id in (3, 1, 4):
            store.put(client_id, state(client_id))
        store.put(3, state(30))  # overwrite
        assert store.client_ids() == [1, 3, 4]
        torch.testing.assert_close(store.get(3), state(30))
        exported = tmp_path / f"export-{type(store).__name__}"
        store.export_to(exported)
        copy = InMemoryClientStateStore()
        copy.import_from(exported)
        for client_id in (1, 3, 4):
            torch.testing.assert_close(copy.get(client_id), store.get(client_id))
    assert stores[2].spilled  # 3 clients x 36 bytes > 100-byte budget
    assert not list((tmp_path / "disk").glob(".*"))  # no temporary files left by atomic writes


def test_disk_and_memory_stores_train_identical_models(tmp_path):
    _, memory = run(tmp_path / "memory", fed_algorithm="scaffold", client_state_store="memory")
    _, disk = run(tmp_path / "disk", fed_algorithm="scaffold", client_state_store="disk")
    _, auto = run(tmp_path / "auto", fed_algorithm="scaffold", client_state_store="auto", client_state_memory_mb=1e-4)
    torch.testing.assert_close(memory.params, disk.params, rtol=0, atol=0)
    torch.testing.assert_close(memory.params, auto.params, rtol=0, atol=0)
    assert list((tmp_path / "disk" / "client_states").glob("client-*.safetensors"))
    assert list((tmp_path / "auto" / "client_states").glob("client-*.safetensors"))  # spilled


def test_auto_store_keeps_the_budget_in_memory_and_the_rest_on_disk(tmp_path):
    """36-byte states, 80-byte budget: two clients in memory, later ones on disk, one copy each."""
    store = AutoClientStateStore(tmp_path / "auto", memory_budget_bytes=80)
    assert not store.spilled and not (tmp_path / "auto").exists()  # no folder until something spills
    for client_id in range(5):
        store.put(client_id, state(client_id))
        assert store.memory.nbytes <= 80
    assert store.memory.client_ids() == [0, 1] and store.disk.client_ids() == [2, 3, 4] and store.spilled
    bigger = {"scaffold": {"c_i": torch.ones(30)}}  # 120 bytes: client 1 no longer fits, it moves to disk
    store.put(1, bigger)
    assert store.memory.client_ids() == [0] and store.disk.client_ids() == [1, 2, 3, 4]
    store.put(3, state(33))  # fits again in memory: its file goes away
    assert store.memory.client_ids() == [0, 3] and store.disk.client_ids() == [1, 2, 4]
    expected = {0: state(0), 1: bigger, 2: state(2), 3: state(33), 4: state(4)}
    assert store.client_ids() == [0, 1, 2, 3, 4]
    for client_id, value in expected.items():
        torch.testing.assert_close(store.get(client_id), value)
    store.export_to(tmp_path / "export")
    copy = AutoClientStateStore(tmp_path / "copy", memory_budget_bytes=0)  # everything on disk
    copy.import_from(tmp_path / "export")
    assert copy.memory.client_ids() == [] and copy.client_ids() == [0, 1, 2, 3, 4]
    for client_id, value in expected.items():
        torch.testing.assert_close(copy.get(client_id), value)
    store.clear()
    assert store.client_ids() == [] and store.get(2) == {}


def test_lesam_old_models_on_disk_train_the_same_model_and_resume_exactly(tmp_path):
    """FedLESAM keeps w_old per client: disk and spilling stores equal memory, also across a resume."""
    common = dict(fed_algorithm="fedlesam", num_rounds=4, rho=0.2)
    _, memory = run(tmp_path / "memory", client_state_store="memory", **common)
    _, disk = run(tmp_path / "disk", client_state_store="disk", **common)
    torch.testing.assert_close(memory.params, disk.params, rtol=0, atol=0)
    run(tmp_path / "cut", client_state_store="auto", client_state_memory_mb=1e-4, save_every_n_rounds=1,
        **{**common, "num_rounds": 2})
    trainer, resumed = run(tmp_path / "cut", client_state_store="auto", client_state_memory_mb=1e-4,
                           resume="latest", model_seed=5, **common)
    torch.testing.assert_close(resumed.params, memory.params, rtol=0, atol=0)
    assert trainer.store.spilled and trainer.store.memory.nbytes <= 1e-4 * 2**20
    assert not list((tmp_path / "disk" / "client_states").glob(".*"))  # no temporary files left
