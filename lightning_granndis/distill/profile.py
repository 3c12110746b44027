"""Per-block timings for Automatic Hybrid Distribution (Pipe-BD §III-C, "profile each block at
every feasible per-rank batch size")."""

from __future__ import annotations

import copy
import time
from typing import Callable, Sequence

import torch
from torch import nn

from lightning_granndis.distill.blocks import guide_features

BlockLoss = Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor]


def _median_seconds(fn: Callable[[], None], repeats: int) -> float:
    fn()  # warm-up (allocator, lazy kernels)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def profile_blocks(
    teacher: Sequence[nn.Module],
    student: Sequence[nn.Module],
    example: torch.Tensor,
    rows: int,
    block_loss: BlockLoss,
    repeats: int = 3,
) -> tuple[list[float], list[float]]:
    """Seconds of each teacher block's forward and each student block's forward + backward on a
    ``rows``-row batch made from ``example`` (one sample, ``[1, ...]``).

    The student's parameters, gradients and buffers (BatchNorm statistics) are restored afterwards,
    so profiling leaves training exactly as it would have been.
    """
    x = example.expand(rows, *example.shape[1:]).contiguous()
    x = x + 0.1 * torch.randn(x.shape, generator=torch.Generator().manual_seed(0)).to(x.device, x.dtype)
    inputs, outputs = guide_features(teacher, x)
    saved = [copy.deepcopy(b.state_dict()) for b in student]
    teacher_s, student_s = [], []
    for i, (t_block, s_block) in enumerate(zip(teacher, student)):
        def teacher_fwd(i=i, t_block=t_block):
            with torch.no_grad():
                t_block(inputs[i])

        def student_fwd_bwd(i=i, s_block=s_block):
            block_loss(i, s_block(inputs[i]), outputs[i]).backward()

        teacher_s.append(_median_seconds(teacher_fwd, repeats))
        student_s.append(_median_seconds(student_fwd_bwd, repeats))
    for block, state in zip(student, saved):
        block.load_state_dict(state)
        for p in block.parameters():
            p.grad = None
    return teacher_s, student_s


def feature_bytes_per_row(teacher: Sequence[nn.Module], example: torch.Tensor, label_bytes: int = 8) -> list[int]:
    """Bytes per row of each teacher block's output (what the next stage receives), plus a label."""
    _, outputs = guide_features(teacher, example)
    return [o[0].numel() * o.element_size() + label_bytes for o in outputs]


def parameter_bytes(student: Sequence[nn.Module]) -> list[int]:
    return [sum(p.numel() * p.element_size() for p in b.parameters() if p.requires_grad) for b in student]


def candidate_widths(batch: int, world_size: int) -> list[int]:
    """Data-parallel widths worth profiling: every width up to the world that leaves each rank a row."""
    return list(range(1, min(world_size, batch) + 1))
