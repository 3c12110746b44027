"""Blockwise distillation's building blocks: guide features and block checks (plain torch).

Blockwise distillation (DNA, Li et al. CVPR'20; Pipe-BD, Jang et al. DATE'23, §II) trains student
block ``i`` to map the teacher's input of block ``i`` to the teacher's output of block ``i``:

.. math::
    \\mathcal{L}_i = \\ell_i\\big(S_i(h_{i-1}),\\, h_i\\big), \\qquad h_i = T_i(h_{i-1}),\\; h_{-1} = x

so the blocks share no weights and need nothing from each other but the teacher's features.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn


class TeacherCounter:
    """Counts teacher block executions (one per block call, whatever the batch)."""

    def __init__(self, num_blocks: int) -> None:
        self.per_block = [0] * num_blocks

    @property
    def total(self) -> int:
        return sum(self.per_block)


@torch.no_grad()
def guide_features(
    teacher: Sequence[nn.Module], x: torch.Tensor, first: int = 0, last: int | None = None,
    counter: TeacherCounter | None = None,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Runs teacher blocks ``first..last`` on ``x`` (the input of block ``first``) without
    gradients; returns each block's input and output (the guide features)."""
    last = len(teacher) - 1 if last is None else last
    inputs, outputs = [], []
    h = x
    for i in range(first, last + 1):
        inputs.append(h)
        h = teacher[i](h)
        if not isinstance(h, torch.Tensor):
            raise TypeError(f"teacher block {i} returned {type(h).__name__}; blocks must return one tensor.")
        outputs.append(h)
        if counter is not None:
            counter.per_block[i] += 1
    return inputs, outputs


def check_blocks(teacher: Sequence[nn.Module], student: Sequence[nn.Module], example: torch.Tensor | None = None) -> None:
    """Raises a ``ValueError`` naming the problem unless teacher and student have the same number of
    blocks, the teacher has at least one, and (given an example input) every student block maps its
    teacher block's input to a tensor of its teacher block's output shape."""
    if len(teacher) == 0:
        raise ValueError("blockwise distillation needs at least one teacher block; got none.")
    if len(teacher) != len(student):
        raise ValueError(
            f"the teacher has {len(teacher)} blocks but the student {len(student)}: blockwise distillation pairs "
            "student block i with teacher block i, so give both the same number of blocks."
        )
    if example is None:
        return
    inputs, outputs = guide_features(teacher, example)
    modes = [b.training for b in student]
    try:
        with torch.no_grad():
            for i, (block, x, t) in enumerate(zip(student, inputs, outputs)):
                block.eval()  # one example row: BatchNorm cannot use batch statistics
                check_output(i, block(x), t)
    finally:
        for block, mode in zip(student, modes):
            block.train(mode)


def check_output(index: int, student_out: torch.Tensor, teacher_out: torch.Tensor) -> None:
    if not isinstance(student_out, torch.Tensor):
        raise TypeError(f"student block {index} returned {type(student_out).__name__}; blocks must return one tensor.")
    if student_out.shape != teacher_out.shape:
        raise ValueError(
            f"student block {index} outputs shape {tuple(student_out.shape)} but teacher block {index} outputs "
            f"{tuple(teacher_out.shape)}: a student block must reproduce its teacher block's output shape "
            "(same channels and spatial size)."
        )
