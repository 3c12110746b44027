"""AdaQP-style stochastic quantisation of halo messages (Wan et al., MLSys'23,
`arXiv:2306.01381 <https://arxiv.org/abs/2306.01381>`_), uniform bit width.

Every row :math:`x \\in \\mathbb{R}^d` sent to a peer is coded with ``b`` bits per element:

.. math::
    m = \\min x,\\; s = \\frac{2^b - 1}{\\max x - m},\\;
    q = \\lfloor (x - m)s + u \\rfloor,\\; u \\sim U[0, 1),\\qquad \\hat{x} = q / s + m

Stochastic rounding makes :math:`\\hat{x}` unbiased (:math:`E[\\hat{x}] = x`) with per-element
variance at most :math:`(\\max x - m)^2 / (4 (2^b - 1)^2)`. Codes are packed ``8/b`` per byte and
sent with ``(m, s)`` per row; the backward pass quantises the halo gradients the same way.
"""

from __future__ import annotations

from typing import Sequence

import torch

BITS = (2, 4, 8)


def quantise(x: torch.Tensor, bits: int, generator: torch.Generator | None = None):
    """Returns ``(packed [n, ceil(d / (8 / bits))] uint8, params [n, 2] float32 (min, scale))``."""
    if bits not in BITS:
        raise ValueError(f"bits must be one of {BITS}, got {bits}.")
    x = x.float()
    n, d = x.shape
    mn = x.min(1).values if d else x.new_zeros(n)
    mx = x.max(1).values if d else x.new_zeros(n)
    levels = 2**bits - 1
    scale = levels / (mx - mn).clamp_min(1e-12)
    u = torch.rand(x.shape, generator=generator, device=x.device) if generator is not None else torch.rand_like(x)
    q = torch.floor((x - mn[:, None]) * scale[:, None] + u).clamp_(0, levels).to(torch.uint8)
    per_byte = 8 // bits
    pad = (-d) % per_byte
    if pad:
        q = torch.cat([q, q.new_zeros(n, pad)], 1)
    q = q.view(n, -1, per_byte)
    packed = torch.zeros(q.shape[:2], dtype=torch.uint8, device=x.device)
    for i in range(per_byte):
        packed |= q[:, :, i] << (bits * i)
    return packed, torch.stack([mn, scale], 1)


def dequantise(packed: torch.Tensor, params: torch.Tensor, bits: int, width: int) -> torch.Tensor:
    """Inverse of :func:`quantise` (``width`` = the original ``d``)."""
    per_byte = 8 // bits
    mask = 2**bits - 1
    codes = torch.stack([(packed >> (bits * i)) & mask for i in range(per_byte)], 2).view(packed.shape[0], -1)
    codes = codes[:, :width].float()
    return codes / params[:, 1:2] + params[:, 0:1]


def _send(comm, x, send_splits, recv_splits, bits, purpose, group):
    packed, params = quantise(x, bits)
    packed, _ = comm.all_to_all(packed, send_splits, purpose, group, recv_splits=recv_splits)
    params, _ = comm.all_to_all(params, send_splits, purpose, group, recv_splits=recv_splits)
    return dequantise(packed, params, bits, x.shape[1]).to(x.dtype)


class _QuantisedAllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rows, comm, send_splits, recv_splits, bits, purpose, group):
        ctx.args = (comm, send_splits, recv_splits, bits, purpose, group)
        return _send(comm, rows, send_splits, recv_splits, bits, purpose, group)

    @staticmethod
    def backward(ctx, grad):
        comm, send_splits, recv_splits, bits, purpose, group = ctx.args
        back = _send(comm, grad.contiguous(), recv_splits, send_splits, bits, purpose, group)
        return back, None, None, None, None, None, None


def quantised_exchange(comm, rows: torch.Tensor, send_splits: Sequence[int], recv_splits: Sequence[int], bits: int,
                       purpose: str = "halo", group=None) -> torch.Tensor:
    """The halo all-to-all with ``bits``-bit stochastic quantisation both ways (forward rows and
    backward gradients). ``rows`` ``[sum(send_splits), d]`` → ``[sum(recv_splits), d]``."""
    return _QuantisedAllToAll.apply(rows, comm, list(send_splits), list(recv_splits), bits, purpose, group)
