"""Student blocks built from their teacher blocks' input and output shapes.

A student block must reproduce its teacher block's output shape from the same input. Here it
is narrower and shallower: a 3x3 convolution to the output channels (stride 2 if the resolution
halves), an inverted residual per further halving, and one inverted residual with a linear
bottleneck, like the teacher's — with a smaller expansion ratio than the teacher's 6. A logits block is a 1x1 convolution,
pooling and a linear layer.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn


def student_block(in_shape: Sequence[int], out_shape: Sequence[int], expand_ratio: int = 2) -> nn.Module:
    """A student block mapping ``[C, H, W]`` to ``[C', H/s, W/s]`` (``s`` a power of two) or to
    ``[K]`` logits. Shapes exclude the batch dimension."""
    from torchvision.models.mobilenetv2 import InvertedResidual

    c_in = in_shape[0]
    if len(out_shape) == 1:
        hidden = max(32, 2 * c_in)
        return nn.Sequential(nn.Conv2d(c_in, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6(inplace=True),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(hidden, out_shape[0]))
    if len(in_shape) != 3 or len(out_shape) != 3:
        raise ValueError(f"student blocks map images to images or logits; got {tuple(in_shape)} -> {tuple(out_shape)}.")
    c_out, stride = out_shape[0], in_shape[1] // out_shape[1]
    if stride < 1 or stride & (stride - 1) or in_shape[1] != out_shape[1] * stride:
        raise ValueError(f"a student block needs a power-of-two downsampling; got {tuple(in_shape)} -> {tuple(out_shape)}.")
    first_stride = 2 if stride > 1 else 1
    layers: list[nn.Module] = [nn.Conv2d(c_in, c_out, 3, first_stride, 1, bias=False), nn.BatchNorm2d(c_out),
                               nn.ReLU6(inplace=True)]
    stride //= first_stride
    while stride > 1:
        layers.append(InvertedResidual(c_out, c_out, 2, expand_ratio))
        stride //= 2
    layers.append(InvertedResidual(c_out, c_out, 1, expand_ratio))  # linear bottleneck, like the teacher's
    return nn.Sequential(*layers)


@torch.no_grad()
def students_for(teacher_blocks: Sequence[nn.Module], example: torch.Tensor, expand_ratio: int = 2) -> list[nn.Module]:
    """One student block per teacher block, from the shapes ``example`` (``[1, ...]``) takes through them."""
    shapes, h = [], example
    was = [b.training for b in teacher_blocks]
    for b in teacher_blocks:
        b.eval()
    for b in teacher_blocks:
        out = b(h)
        shapes.append((tuple(h.shape[1:]), tuple(out.shape[1:])))
        h = out
    for b, mode in zip(teacher_blocks, was):
        b.train(mode)
    return [student_block(i, o, expand_ratio) for i, o in shapes]
