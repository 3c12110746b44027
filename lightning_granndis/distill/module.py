"""What a LightningModule declares for blockwise distillation: N teacher blocks, N student blocks,
the per-block loss and the optimizers.

On one device, :class:`BlockwiseDistillation` trains every student block on the teacher's features
of the whole batch. Under :class:`~lightning_granndis.strategies.PipeBDStrategy` the same steps
run Pipe-BD (or a baseline) across ranks; nothing in the module changes.
"""

from __future__ import annotations

import copy
from typing import Any, Sequence

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn

from lightning_granndis.distill.blocks import check_blocks
from lightning_granndis.distill.runner import BlockwiseRunner
from lightning_granndis.distill.schedule import DistillSchedule


class BlockwiseDistillation(pl.LightningModule):
    """Base class of blockwise-distillation modules (DNA, Li et al. CVPR'20; Pipe-BD, DATE'23).

    Student block ``i`` learns to map the teacher's input of block ``i`` to the teacher's output
    of block ``i``. The teacher is frozen and always in eval mode.

    Args:
        teacher_blocks: the teacher, as an ordered sequence of blocks (each one tensor in, one out).
        student_blocks: as many student blocks; block ``i`` must return teacher block ``i``'s
            output shape. May be given later with :meth:`set_blocks` (subclasses building them).
        lr: Adam's learning rate (default 1e-3).
        weight_decay: AdamW's weight decay (default 0).
        kd_temperature: the last block, when it outputs logits (2-D), is trained with knowledge
            distillation at this temperature (default 4); ``None``: MSE like every other block.

    Override :meth:`block_loss` for other losses, :meth:`distill_input` when a batch is not
    ``(x, y)``, and ``configure_optimizers`` freely (over ``self.student``). Logged: ``train_loss``
    (this rank's blocks) per step; ``train_block{i}_loss`` per epoch; ``val_loss`` (sum over
    blocks), ``val_block{i}_loss``, ``val_student_acc`` (the student assembled end to end) and
    ``val_teacher_acc`` (likewise ``test_*``).
    """

    #: set by PipeBDStrategy; ``None``: everything on this device
    _distill_runner: BlockwiseRunner | None = None

    def __init__(self, teacher_blocks: Sequence[nn.Module] | None = None,
                 student_blocks: Sequence[nn.Module] | None = None, lr: float = 1e-3,
                 weight_decay: float = 0.0, kd_temperature: float | None = 4.0) -> None:
        super().__init__()
        self.lr, self.weight_decay, self.kd_temperature = lr, weight_decay, kd_temperature
        self.teacher = nn.ModuleList()
        self.student = nn.ModuleList()
        if teacher_blocks is not None or student_blocks is not None:
            self.set_blocks(teacher_blocks or [], student_blocks or [])

    def set_blocks(self, teacher_blocks: Sequence[nn.Module], student_blocks: Sequence[nn.Module]) -> None:
        check_blocks(list(teacher_blocks), list(student_blocks))
        self.teacher = nn.ModuleList(teacher_blocks)
        self.student = nn.ModuleList(student_blocks)
        for p in self.teacher.parameters():
            p.requires_grad_(False)
        self.teacher.eval()

    @property
    def num_blocks(self) -> int:
        return len(self.student)

    def train(self, mode: bool = True) -> "BlockwiseDistillation":
        super().train(mode)
        self.teacher.eval()  # frozen: BatchNorm keeps its running statistics
        return self

    # ------------------------------------------------------------------ hooks
    def distill_input(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(x, labels)`` of a batch (default ``batch[0], batch[1]``; labels may be ``None``)."""
        if isinstance(batch, torch.Tensor):
            return batch, None
        return batch[0], (batch[1] if len(batch) > 1 else None)

    def block_loss(self, index: int, student_out: torch.Tensor, teacher_out: torch.Tensor) -> torch.Tensor:
        """MSE between features; the last block's logits by KD (``kd_temperature``). A mean over rows."""
        if index == self.num_blocks - 1 and self.kd_temperature is not None and teacher_out.dim() == 2:
            t = self.kd_temperature
            return F.kl_div(F.log_softmax(student_out / t, -1), F.log_softmax(teacher_out / t, -1),
                            reduction="batchmean", log_target=True) * t * t
        return F.mse_loss(student_out, teacher_out)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.student.parameters(), lr=self.lr, weight_decay=self.weight_decay)

    # ------------------------------------------------------------------ the student
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The student, end to end."""
        for block in self.student:
            x = block(x)
        return x

    def assemble_student(self) -> nn.Sequential:
        """The distilled student as one ordinary ``nn.Module`` (a copy, on the CPU, in eval mode).
        Under :class:`~lightning_granndis.strategies.PipeBDStrategy` every rank holds every trained
        block once ``fit`` returns."""
        return nn.Sequential(*copy.deepcopy(list(self.student))).cpu().eval()

    # ------------------------------------------------------------------ steps
    def distill_runner(self) -> BlockwiseRunner:
        if self._distill_runner is None:  # one device: one stage holding every block
            schedule = DistillSchedule.build([list(range(self.num_blocks))])
            self._distill_runner = BlockwiseRunner(self.teacher, self.student, self.block_loss, schedule,
                                                   device=self.device)
        return self._distill_runner

    def _batch(self, batch: Any):
        return self.distill_input(batch) if isinstance(batch, (torch.Tensor, tuple, list, dict)) else None

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self.distill_runner().train_step(self._batch(batch))
        self.log("train_loss", loss.detach(), prog_bar=True, batch_size=1)
        return loss

    def on_train_epoch_end(self) -> None:
        losses = self.distill_runner().epoch_losses()
        for i, value in enumerate(losses):
            self.log(f"train_block{i}_loss", value, sync_dist=True)  # equal on every rank already
        self.log("train_blocks_loss", float(sum(losses)), sync_dist=True)

    def _eval(self, batch: Any, prefix: str) -> None:
        out = self.distill_runner().eval_step(self._batch(batch))
        rows = out.pop("rows")
        for key, value in out.items():
            self.log(f"{prefix}_{key}", value, prog_bar=key in ("loss", "student_acc"), batch_size=rows,
                     sync_dist=True)  # equal on every rank already: the mean changes nothing

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._eval(batch, "val")

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._eval(batch, "test")
