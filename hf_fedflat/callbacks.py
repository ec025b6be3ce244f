"""The base of a federated run's callbacks (round hooks in the spirit of ``transformers.TrainerCallback``).

It lives at the package's top level, importing nothing of ``hf_fedflat``, so that callbacks defined
elsewhere (the Hub push and the model card in ``hf_fedflat.hub``) do not import the trainer's package.
"""

from __future__ import annotations

from typing import Any


class FederatedCallback:
    """Override any hook; each receives the trainer and keyword details.

    ``on_round_begin`` and ``on_client_end`` run on every process (``on_client_end`` on the process that
    trained the client); the others on the main process only. ``on_train_begin`` runs once the run's
    starting point is known (after a resume), ``on_train_end`` after ``final_model/`` is saved (keyword
    ``final_model_dir``).
    """

    def on_train_begin(self, trainer, **kwargs: Any) -> None: ...

    def on_round_begin(self, trainer, round_index: int, clients: list[int], **kwargs: Any) -> None: ...

    def on_client_end(self, trainer, round_index: int, update, **kwargs: Any) -> None: ...

    def on_aggregate(self, trainer, round_index: int, updates: list, **kwargs: Any) -> None: ...

    def on_round_end(self, trainer, round_index: int, record: dict, **kwargs: Any) -> None: ...

    def on_train_end(self, trainer, history: list[dict], **kwargs: Any) -> None: ...
