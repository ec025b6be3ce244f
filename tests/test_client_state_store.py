"""The client-state store: memory, disk and auto (spilling) hold the same states and train the same model."""

from __future__ import annotations

import torch

from hf_fedflat.state import (
    AutoClientStateStore,
    DiskClientStateStore,
    InMemoryClientStateStore,
)

from test_federated_run import run


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
