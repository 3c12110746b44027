"""Peak memory per rank during training: the allocator's high-water mark and the activations."""

from __future__ import annotations

import resource
import sys

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lightning_granndis import comm


def peak_rss_mb() -> float:
    """This process's peak resident set size in MB (``ru_maxrss``)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def _dense_parts(tensor: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The strided tensors holding ``tensor``'s data: itself, or a sparse tensor's index and
    value arrays (a sparse CSR adjacency has no storage of its own)."""
    if tensor.layout == torch.sparse_csr:
        return tensor.crow_indices(), tensor.col_indices(), tensor.values()
    if tensor.layout == torch.sparse_coo:
        return tensor._indices(), tensor._values()
    if tensor.layout != torch.strided:
        return ()
    return (tensor,)


class PeakMemory(Callback):
    """Measures, per rank, what training holds at its peak:

    - ``peak_mem_mb``: on GPU ``torch.cuda.max_memory_allocated``; on CPU the process's peak
      resident set (everything: interpreter, libraries, the graph, plans and training);
    - ``activation_mb``: the largest total of tensors autograd saved for backward in one step
      (counted once per storage) — the part of memory that batch and subgraph sizes drive, free of
      allocator effects.

    Both are logged at the end of every epoch (maximum over ranks) and kept in :attr:`per_rank`.
    """

    def __init__(self) -> None:
        self.activation_bytes = 0
        self.per_rank: list[dict[str, float]] = []
        self._hooks = None
        self._seen: set[int] = set()
        self._step_bytes = 0

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        for part in _dense_parts(tensor):
            key = part.untyped_storage().data_ptr()
            if key not in self._seen:
                self._seen.add(key)
                self._step_bytes += part.untyped_storage().nbytes()
        return tensor

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(trainer.strategy.root_device)

    @override
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._seen.clear()
        self._step_bytes = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()

    @override
    def on_before_backward(self, trainer, pl_module, loss) -> None:
        if self._hooks is not None:
            self._hooks.__exit__(None, None, None)
            self._hooks = None
        self.activation_bytes = max(self.activation_bytes, self._step_bytes)

    @override
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._hooks is not None:  # no backward ran (e.g. manual optimisation skipped it)
            self._hooks.__exit__(None, None, None)
            self._hooks = None

    def measure(self, trainer: pl.Trainer) -> dict[str, float]:
        device = trainer.strategy.root_device
        peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else peak_rss_mb()
        return {"peak_mem_mb": peak, "activation_mb": self.activation_bytes / 2**20}

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.per_rank = comm.gather_objects(self.measure(trainer))
        if trainer.is_global_zero:
            worst = {k: max(r[k] for r in self.per_rank) for k in self.per_rank[0]}
            for logger in trainer.loggers:
                logger.log_metrics(worst, step=trainer.global_step)
