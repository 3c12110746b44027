"""Wall time of every training step (forward, backward, gradient sync and optimizer step)."""

from __future__ import annotations

import statistics
import time

from lightning.pytorch.callbacks import Callback
from typing_extensions import override


class StepTimer(Callback):
    """Records each training step's wall seconds in :attr:`times`, after ``warmup`` steps.

    Args:
        warmup: steps to leave out (allocator and autograd warm-up), default 3.
    """

    def __init__(self, warmup: int = 3) -> None:
        self.warmup = warmup
        self.times: list[float] = []
        self._seen = 0
        self._t0 = 0.0

    @override
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._t0 = time.perf_counter()

    @override
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._seen += 1
        if self._seen > self.warmup:
            self.times.append(time.perf_counter() - self._t0)

    @property
    def median(self) -> float:
        return statistics.median(self.times) if self.times else float("nan")
