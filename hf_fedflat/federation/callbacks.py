"""Round-level hooks in the spirit of ``transformers.TrainerCallback``, and report_to logging."""

from __future__ import annotations

from typing import Any

from transformers import TrainerControl, TrainerState
from transformers.integrations import get_reporting_integration_callbacks


class FederatedCallback:
    """Override any hook; each receives the ``FederatedTrainer`` and keyword details."""

    def on_round_begin(self, trainer, round_index: int, clients: list[int], **kwargs: Any) -> None: ...

    def on_client_end(self, trainer, round_index: int, update, **kwargs: Any) -> None: ...

    def on_aggregate(self, trainer, round_index: int, updates: list, **kwargs: Any) -> None: ...

    def on_round_end(self, trainer, round_index: int, record: dict, **kwargs: Any) -> None: ...

    def on_train_end(self, trainer, history: list[dict], **kwargs: Any) -> None: ...


class RoundReporter:
    """Sends one log per round (step = round number) to every ``report_to`` integration.

    Reuses transformers' own integration callbacks (TensorBoard, W&B, MLflow, ...), driven with a
    ``TrainerState`` whose ``global_step`` is the round.
    """

    def __init__(self, args, model=None):
        self.args = args
        self.model = model
        self.state = TrainerState(is_world_process_zero=True)
        self.control = TrainerControl()
        self.integrations = [cls() for cls in get_reporting_integration_callbacks(args.report_to)]
        self._started = False

    def log(self, round_number: int, metrics: dict) -> None:
        if not self.integrations:
            return
        if not self._started:
            for integration in self.integrations:
                integration.on_train_begin(self.args, self.state, self.control, model=self.model)
            self._started = True
        self.state.global_step = round_number
        scalars = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        for integration in self.integrations:
            integration.on_log(self.args, self.state, self.control, logs=scalars)

    def close(self) -> None:
        if self._started:
            for integration in self.integrations:
                integration.on_train_end(self.args, self.state, self.control, model=self.model)
            self._started = False
