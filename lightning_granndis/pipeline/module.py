"""What a LightningModule declares to be pipelined: its blocks, the first block's input, the loss.

A :class:`PipelinedModule` is an ordinary LightningModule whose layers are an ordered sequence of
blocks, each taking and returning one tensor. Its steps call :meth:`PipelinedModule.pipeline_step`;
on one device that is ``pipeline_loss(blocks(pipeline_input(batch)), batch)``, under
:class:`~lightning_granndis.strategies.CompressedPipelineStrategy` the same value computed by the
pipeline (forward and, in training, backward of every micro-batch), reported on every rank.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import lightning.pytorch as pl
import torch
from torch import nn


class PipelinedModule(pl.LightningModule):
    """Base class for modules the pipeline strategies can split into stages.

    Override :meth:`pipeline_blocks` (default: the ``blocks`` attribute, an ``nn.Sequential`` or
    ``nn.ModuleList``) and :meth:`pipeline_loss`; override :meth:`pipeline_input` when the first
    block's input is not ``batch[0]``. Every parameter must live in a block; a parameter shared by
    two blocks (tied input/output embeddings) is kept in sync across the stages that hold it.

    ``training_step``/``validation_step``/``test_step`` below log ``{train,val,test}_loss``; write
    your own freely, as long as they get the loss from :meth:`pipeline_step` (once per step).
    Metrics from outputs: ``loss, out = self.pipeline_step(batch, return_outputs=True)`` in a step,
    or ``self(x)`` without gradients (validation, test, predict); both give the last block's output
    on every rank, so logged metrics, ``ModelCheckpoint`` and ``EarlyStopping`` work on them. Do not
    log inside :meth:`pipeline_loss`: under the pipeline it runs on the last stage only.
    """

    #: set by the pipeline strategy: ``runner(module, batch) -> loss`` (``None``: plain forward)
    _pipeline_runner: Callable[["PipelinedModule", Any], torch.Tensor] | None = None

    def pipeline_blocks(self) -> Sequence[nn.Module]:
        blocks = getattr(self, "blocks", None)
        if not isinstance(blocks, (nn.Sequential, nn.ModuleList)):
            raise TypeError(
                f"{type(self).__name__} has no `blocks` (nn.Sequential or nn.ModuleList): assign one, or override "
                "pipeline_blocks() to return the ordered blocks the pipeline splits into stages."
            )
        return list(blocks)

    def pipeline_input(self, batch: Any) -> torch.Tensor:
        """The first block's input (default ``batch[0]``)."""
        return batch[0]

    def pipeline_loss(self, output: torch.Tensor, batch: Any) -> torch.Tensor:
        """The mean loss of the last block's ``output`` on ``batch`` (a micro-batch under a pipeline)."""
        raise NotImplementedError(f"{type(self).__name__} must implement pipeline_loss(output, batch).")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The last block's output for the first block's input ``x``. Under a pipeline strategy a
        forward-only pass through the stages, the output on every rank (so ``self(x)`` works in
        ``validation_step``/``test_step``/``predict_step``; it needs gradients off)."""
        if self._pipeline_runner is not None:
            return self._pipeline_runner.forward_outputs(x)
        for block in self.pipeline_blocks():
            x = block(x)
        return x

    def pipeline_step(self, batch: Any, return_outputs: bool = False):
        """The batch's loss: run by the pipeline when one is attached, else on this device. With
        ``return_outputs``, ``(loss, outputs)``: also the last block's output for the whole batch,
        detached, on every rank, to compute metrics from (it is sent from the last stage to the
        others: a tensor of the output's size per step)."""
        if self._pipeline_runner is not None:
            return self._pipeline_runner(self, batch, return_outputs=return_outputs)
        output = self(self.pipeline_input(batch))
        loss = self.pipeline_loss(output, batch)
        return (loss, output.detach()) if return_outputs else loss

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self.pipeline_step(batch)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self.pipeline_step(batch)
        self.log("val_loss", loss, prog_bar=True, sync_dist=True)
        return loss

    def test_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self.pipeline_step(batch)
        self.log("test_loss", loss, sync_dist=True)
        return loss

    def predict_step(self, batch: Any, batch_idx: int = 0) -> torch.Tensor:
        """The last block's output for the batch, on every rank."""
        return self(self.pipeline_input(batch))


def batch_rows(batch: Any) -> int:
    """Rows (dim 0) of the first tensor in ``batch``."""
    if isinstance(batch, torch.Tensor):
        return batch.shape[0]
    if isinstance(batch, dict):
        return batch_rows(next(iter(batch.values())))
    if isinstance(batch, (list, tuple)):
        return batch_rows(batch[0])
    raise TypeError(f"cannot split a batch of type {type(batch).__name__} into micro-batches; use tensors, "
                    "tuples, lists or dicts of tensors.")


def slice_batch(batch: Any, start: int, stop: int) -> Any:
    """Rows ``start:stop`` of every tensor in ``batch`` (non-tensors are kept whole)."""
    if isinstance(batch, torch.Tensor):
        return batch[start:stop]
    if isinstance(batch, dict):
        return {k: slice_batch(v, start, stop) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(slice_batch(v, start, stop) for v in batch)
    return batch


def micro_ranges(rows: int, micro_batches: int) -> list[tuple[int, int]]:
    """``micro_batches`` near-equal row ranges (fewer when the batch has fewer rows)."""
    m = max(1, min(micro_batches, rows))
    bounds = [round(i * rows / m) for i in range(m + 1)]
    return [(bounds[i], bounds[i + 1]) for i in range(m)]
