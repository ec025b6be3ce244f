"""The one switch of the fast path.

Every speed mechanism of the toolkit (``hf_fedflat.runtime``) asks :func:`enabled` before it acts; with
the fast path off, the client trains through the plain ``transformers.Trainer`` path and memory is
allocated and freed as PyTorch does by default. Both paths give bit-identical weights (tested).

* ``HF_FEDFLAT_FAST_PATH=0`` in the environment turns it off for the process (read once, at import);
  ``1`` or unset: on. For benchmarks, ``-name,-name`` leaves the named mechanisms off and the rest on.
* ``with fast_path(False): ...`` turns it off for the code inside the block, in this thread (the
  benchmark runs sides in threads of one process, each with its own setting).

A ``ClientTrainer`` reads the setting once, when it is built; the other mechanisms when they act.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

#: the mechanisms behind the switch (names for ``without=`` and the environment variable; see the README)
MECHANISMS: tuple[str, ...] = (
    "recycle_vectors",   # model-sized vectors reuse their storage (vectors.recycle_vectors)
    "buffer_pool",       # exchange buffers of the cross-process gather reused between rounds (vectors.BufferPool)
    "heap_trim",         # malloc_trim between clients once freed heap memory piles up (memory.HeapTrimmer)
    "optimizer_reuse",   # one prepared optimizer for every client, its state cleared (trainer.reset_optimizer)
    "step_buffers",      # the step's scratch vectors kept, corrections added to p.grad in place
    "free_memory",       # accelerator.free_memory without its gc.collect() per client
    "cached_lookups",    # accelerate's is_lomo_available / is_deepspeed_available cached
    "seed_shortcut",     # CPU generators seeded directly instead of transformers.set_seed
    "select_rows",       # client datasets selected without hashing the transform (datasets.select_rows)
    "materialize",       # fixed-shape numeric client data read once into tensors, batches by one index (materialize)
    "client_loop",       # the Trainer's loop without what the federated loop turned off (client_loop)
    "transform_batches",  # a transformed dataset's client batches: one dataset[rows] each, no select (transform_rows)
    "eval_rows",         # evaluation sets read once, their batches replayed by every evaluation (eval_data)
    "eval_loop",         # the Trainer's evaluation loop over kept rows without a DataLoader on one process (eval_loop)
)


@dataclass(frozen=True)
class FastPath:
    """Which mechanisms are on."""

    off: frozenset[str] = frozenset()

    def __call__(self, mechanism: str) -> bool:
        return mechanism not in self.off

    @property
    def enabled(self) -> bool:
        """The whole fast path is on."""
        return not self.off


ON = FastPath()
OFF = FastPath(frozenset(MECHANISMS))


def parse(value: str | None) -> FastPath:
    """The setting an ``HF_FEDFLAT_FAST_PATH`` value stands for."""
    value = (value or "1").strip().lower()
    if value in ("1", "true", "on", "yes"):
        return ON
    if value in ("0", "false", "off", "no"):
        return OFF
    names = [name.strip() for name in value.split(",") if name.strip()]
    unknown = [name for name in names if not name.startswith("-") or name[1:] not in MECHANISMS]
    if unknown:
        raise ValueError(f"HF_FEDFLAT_FAST_PATH: use 0, 1 or a list of '-<mechanism>' from {MECHANISMS}; got {unknown}")
    return FastPath(frozenset(name[1:] for name in names))


_PROCESS_DEFAULT = parse(os.environ.get("HF_FEDFLAT_FAST_PATH"))


class _Current(threading.local):
    setting: FastPath = _PROCESS_DEFAULT


_current = _Current()


def current() -> FastPath:
    """The setting in force in this thread."""
    return _current.setting


def enabled(mechanism: str) -> bool:
    """Whether ``mechanism`` (one of :data:`MECHANISMS`) is on in this thread."""
    return mechanism not in _current.setting.off


@contextlib.contextmanager
def fast_path(enabled: bool = True, *, without: Iterable[str] = ()) -> Iterator[FastPath]:
    """The fast path on (or off) inside the block, in this thread; ``without``: mechanisms left off."""
    off = set(MECHANISMS) if not enabled else set(without)
    unknown = off - set(MECHANISMS)
    if unknown:
        raise ValueError(f"fast_path: unknown mechanisms {sorted(unknown)}; choose from {MECHANISMS}")
    previous = _current.setting
    _current.setting = setting = FastPath(frozenset(off))
    try:
        yield setting
    finally:
        _current.setting = previous
