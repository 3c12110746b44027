"""Batch normalisation over the rows single-process training normalises, across ranks.

A ``BatchNorm1d`` between message-passing layers normalises over every vertex of the batch (in
full-graph training: the whole graph). Under a distributed GNN strategy each rank holds only its
part, and a plain ``BatchNorm1d`` would normalise over that part (inexact, and differently per
rank); ``SyncBatchNorm`` is GPU-only and would count duplicated (preloaded, halo) rows. Here the
statistics are sums over the rows that *count* (each vertex once across the group) combined by an
autograd-aware all-reduce:

.. math::
    \\mu = \\frac{1}{N}\\sum_{\\text{ranks}} \\sum_{i \\in C_r} x_i,\\qquad
    \\sigma^2 = \\frac{1}{N}\\sum_{\\text{ranks}} \\sum_{i \\in C_r} (x_i - \\mu)^2,\\qquad
    y_i = \\gamma \\frac{x_i - \\mu}{\\sqrt{\\sigma^2 + \\epsilon}} + \\beta

for every local row ``i`` (counted or not: a preloaded copy of a vertex is normalised like the
vertex), with ``N = \\sum_r |C_r|``. The all-reduce's backward sums the gradients over the group,
so the gradients equal single-process training's too. Running statistics are updated as
``BatchNorm1d`` updates them (unbiased variance), identically on every rank.

No ``torch.distributed`` here: the strategy passes ``reduce`` (a sum over its group).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from types import MethodType

import torch
from torch import nn

#: normalisations over a whole graph's rows that no per-row split reproduces (PyG's names)
GRAPH_WIDE_NORMS = ("GraphNorm", "InstanceNorm", "PairNorm", "DiffGroupNorm", "MeanSubtractionNorm", "GraphSizeNorm")

#: what a batch-norm call needs: the local rows that count ``[n]`` bool (``None``: all of them),
#: and a sum over the group
NormContext = tuple[torch.Tensor | None, Callable[[torch.Tensor], torch.Tensor]]


def batch_norm_over_rows(bn: nn.BatchNorm1d, x: torch.Tensor, counted: torch.Tensor,
                         reduce: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``bn`` in training mode on ``x`` ``[n, F]``, statistics over the rows ``counted`` ``[n]``
    of every rank (``reduce``: an autograd-aware sum over the group)."""
    w = counted.to(x.dtype).unsqueeze(-1)
    first = reduce(torch.cat([(x * w).sum(0), w.sum(0)]))
    total = first[-1]
    mean = first[:-1] / total
    var = reduce(((x - mean) ** 2 * w).sum(0)) / total
    if bn.track_running_stats and bn.running_mean is not None:
        with torch.no_grad():
            bn.num_batches_tracked.add_(1)
            momentum = 1.0 / float(bn.num_batches_tracked) if bn.momentum is None else bn.momentum
            unbiased = var * total / (total - 1).clamp_min(1)
            bn.running_mean.mul_(1 - momentum).add_(momentum * mean.detach())
            bn.running_var.mul_(1 - momentum).add_(momentum * unbiased.detach())
    y = (x - mean) * torch.rsqrt(var + bn.eps)
    if bn.affine:
        y = y * bn.weight + bn.bias
    return y


class DistributedBatchNorm:
    """Routes every ``nn.BatchNorm1d`` of ``module`` (PyG's ``BatchNorm`` wraps one) through
    :func:`batch_norm_over_rows` while ``context()`` gives ``(counted, reduce)``; with running
    statistics in eval mode, or when ``context()`` is ``None``, the layer runs as it is. Layers whose statistics span a whole
    graph (PyG's ``GraphNorm``, ``InstanceNorm``, ``PairNorm``, ...) cannot be split by rows: a
    warning names each one.

    Args:
        module: the user's model (unmodified).
        context: called at each batch-norm call in training mode.
        strategy_name: for the warning.
    """

    def __init__(self, module: nn.Module, context: Callable[[], NormContext | None], strategy_name: str = "") -> None:
        self.context = context
        self._patched: list[nn.BatchNorm1d] = []
        for name, layer in module.named_modules():
            if isinstance(layer, nn.BatchNorm1d) and not isinstance(layer, nn.SyncBatchNorm):
                layer.forward = MethodType(_make_forward(self, type(layer).forward), layer)
                self._patched.append(layer)
            elif type(layer).__name__ in GRAPH_WIDE_NORMS or _graph_mode_layer_norm(layer):
                warnings.warn(
                    f"{name or 'the model'} ({type(layer).__name__}) normalises over a whole graph's vertices; under "
                    f"{strategy_name or 'a distributed GNN strategy'} each rank holds part of the graph, so it "
                    "normalises over that part and training is not exact. Use BatchNorm1d (exact here), LayerNorm "
                    "or PyG's LayerNorm(mode='node').", stacklevel=2)

    def remove(self) -> None:
        for layer in self._patched:
            del layer.forward  # the class's own forward again
        self._patched.clear()


def _make_forward(owner: DistributedBatchNorm, original):
    def forward(layer: nn.BatchNorm1d, x: torch.Tensor) -> torch.Tensor:
        batch_stats = layer.training or layer.running_mean is None  # as BatchNorm1d decides
        ctx = owner.context() if batch_stats else None
        if ctx is None or x.dim() != 2:
            return original(layer, x)
        counted, reduce = ctx
        if counted is None:  # every row counts
            counted = torch.ones(x.shape[0], dtype=torch.bool, device=x.device)
        if counted.shape[0] != x.shape[0]:
            raise ValueError(
                f"{type(layer).__name__} got {x.shape[0]} rows, but the rank holds {counted.shape[0]} vertices: under a "
                "GNN strategy a BatchNorm1d must normalise the vertex features (one row per vertex), e.g. between "
                "message-passing layers."
            )
        return batch_norm_over_rows(layer, x, counted.to(x.device), reduce)

    return forward


def _graph_mode_layer_norm(layer: nn.Module) -> bool:
    return type(layer).__name__ == "LayerNorm" and getattr(layer, "mode", None) == "graph"
