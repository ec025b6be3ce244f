"""All of the toolkit's speed machinery, behind one switch (:mod:`.switch`).

Nothing here changes a number: with the fast path off (``HF_FEDFLAT_FAST_PATH=0``, or
``with hf_fedflat.runtime.fast_path(False):``) a run gives bit-identical weights through the plain
``transformers.Trainer`` path and PyTorch's own allocations. Each mechanism is kept because
``benchmarks/ablate.py`` measured it saving at least 3% of a round on some workload (README, Performance).

- :mod:`.switch`: the switch (``fast_path``, ``enabled``, ``MECHANISMS``).
- :mod:`.vectors`: recycled model-sized vectors (``recycle_vectors``, ``empty_like``, ...) and the
  exchange's ``BufferPool``.
- :mod:`.memory`: ``HeapTrimmer`` (glibc ``malloc_trim`` / ``mallinfo2`` through ctypes).
- :mod:`.fast_trainer`: ``FastClientTrainer``, the local Trainer's fast path (optimizer reuse, seeding, accelerate
  patches, the lean client loop, the step's fast form), and ``client_trainer_class()``: which local Trainer a run
  builds, the one place the switch chooses it.
- :mod:`.fast_step`: the training step's fast form (preallocated vectors, corrections applied to ``p.grad`` in place).
- :mod:`.finite_fallback`: the perturbations' non-finite fallback around the gradient oracle, without a host-device
  sync on accelerators (not behind the switch: it is part of every step's semantics).
- :mod:`.client_loop`: the lean client loop, ``Trainer._inner_training_loop`` without what the federated loop
  turned off (materialised rows batched without a DataLoader, torch's clipping, one ``model.train()`` per client).
- :mod:`.materialize`: fixed-shape numeric client data read once into tensors.
- :mod:`.eval_data`: evaluation sets read once, their batches replayed to the Trainer's own evaluation loop
  (evaluation, prediction, the diagnostics, the full gradient).
- :mod:`.datasets`: ``select_rows``, client datasets without hashing the transform.
- :mod:`.lanes`: several clients at once in one process (``concurrent_clients``, :mod:`.arguments`): lanes
  with their own model and Trainer, one guard over the global random generators. Not behind the switch: it is
  asked for by a field, and gives the same weights as one client at a time.
"""

from .switch import MECHANISMS, FastPath, current, enabled, fast_path
from .vectors import BufferPool, VectorRecycler, empty, empty_like, recycle_vectors, zeros_like

__all__ = [
    "MECHANISMS",
    "BufferPool",
    "FastPath",
    "VectorRecycler",
    "current",
    "empty",
    "empty_like",
    "enabled",
    "fast_path",
    "recycle_vectors",
    "zeros_like",
]
