"""Per-client state storage."""

from .store import (
    AutoClientStateStore,
    ClientStateStore,
    DiskClientStateStore,
    InMemoryClientStateStore,
    create_client_state_store,
)

__all__ = [
    "AutoClientStateStore", "ClientStateStore", "DiskClientStateStore", "InMemoryClientStateStore",
    "create_client_state_store",
]
