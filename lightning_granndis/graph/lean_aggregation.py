r"""Sparse aggregation that keeps only the graph for backward (the memory-lean path of the GNN
strategies' hooks).

A message-passing layer that aggregates with a sparse adjacency computes, for the rows ``v`` it
owns,

.. math::
    h_v = \frac{1}{s_v} \sum_{u \in \mathcal{N}(v)} w_{uv}\, x_u, \qquad
    s_v = \begin{cases} \max(1, |\mathcal{N}(v)|) & \text{mean} \\ 1 & \text{sum} \end{cases}

i.e. :math:`H = S^{-1} A X` with ``A`` ``[n_dst, n_src]``. Its gradient is
:math:`\partial L / \partial X = A^\top S^{-1}\, \partial L / \partial H`, which needs the graph
but not ``X``. ``torch.sparse.mm``'s own autograd saves ``X`` (``n_src x F``: the owned *and*
halo rows) and the output, and builds the transpose at every backward; :class:`SparseAggregate`
saves nothing but the CSR matrices, built once per graph and layer. For convs that take the
source and target rows as a pair, the owned and the halo rows stay two blocks (never
concatenated: at ogbn-products size that copy was 0.8 GB per layer per rank). Results are those of
PyG's ``spmm`` up to float rounding (the exactness tests compare both paths to ``1e-5``).

:func:`lean_message_and_aggregate` gives a PyG conv that computation for one call, for the convs
whose own ``message_and_aggregate`` is exactly ``spmm(adj_t, x, reduce=self.aggr)`` (``SAGEConv``,
``GraphConv``, ``GINConv``, ``GCNConv``) with a sum or mean reduction; :data:`PAIRED` of them also
take ``x`` as a ``(source rows, target rows)`` pair, so their output has only the owned rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from lightning_granndis.graph.adjacency import csr_adjacency


@dataclass
class LeanAdjacency:
    """The adjacency ``[n_dst, n_src]`` in column blocks (sparse CSR each, with its transpose):
    for a paired conv the owned rows' block and the halo rows' block, so the two need not be
    concatenated; one block otherwise. ``degree`` ``[n_dst, 1]``: neighbours (at least 1)."""

    blocks: list[torch.Tensor]
    blocks_t: list[torch.Tensor]
    degree: torch.Tensor

    @property
    def adj(self) -> torch.Tensor:
        """What the conv is handed as ``edge_index`` (the first block; PyG reads the target count
        from it, and the source count from the features it is given)."""
        return self.blocks[0]

    @classmethod
    def build(cls, edge_index: torch.Tensor, num_dst: int, splits: list[int], weight: torch.Tensor | None = None,
              dtype: torch.dtype = torch.float32) -> "LeanAdjacency":
        """From ``edge_index`` ``[2, E]`` (targets below ``num_dst``), its source rows cut into
        consecutive blocks of ``splits`` rows."""
        src, dst = edge_index
        blocks, blocks_t, start = [], [], 0
        for size in splits:
            keep = (src >= start) & (src < start + size)
            part = torch.stack([src[keep] - start, dst[keep]])
            w = None if weight is None else weight[keep]
            blocks.append(_narrow_index(csr_adjacency(part, num_dst, w, dtype, num_cols=size)))
            blocks_t.append(_narrow_index(csr_adjacency(part.flip(0), size, w, dtype, num_cols=num_dst)))
            start += size
        degree = torch.bincount(dst, minlength=num_dst).clamp_min(1).to(dtype).unsqueeze(1)
        return cls(blocks, blocks_t, degree)


def _narrow_index(adj: torch.Tensor) -> torch.Tensor:
    """``adj`` with int32 indices where they fit (torch.sparse.mm takes them; half the bytes)."""
    if adj._nnz() >= 2**31 - 1 or max(adj.shape) >= 2**31 - 1:
        return adj
    return torch.sparse_csr_tensor(adj.crow_indices().int(), adj.col_indices().int(), adj.values(), adj.shape,
                                   check_invariants=False)


def _mm(adj: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    # on CPU the reducing kernel writes the output once (the plain product builds it twice)
    return torch.sparse.mm(adj, x, "sum") if adj.device.type == "cpu" else torch.sparse.mm(adj, x)


class SparseAggregate(torch.autograd.Function):
    """``out = S^{-1} sum_b A_b x_b`` over column blocks, whose backward is
    ``A_b^T S^{-1} grad`` per block, saving only the graph.

    Shapes: ``x_b`` ``[n_b, F]`` → ``[n_dst, F]``."""

    @staticmethod
    def forward(ctx, graph: LeanAdjacency, mean: bool, *xs: torch.Tensor) -> torch.Tensor:
        ctx.graph, ctx.mean = graph, mean
        # mixed precision: the sparse kernels take no bfloat16/float16 (sparse_mm_reduce refuses
        # them), so a half-precision input is summed in the adjacency's float32, as autocast
        # accumulates a matmul, and the result handed back in the input's dtype
        ctx.dtypes = [x.dtype for x in xs]
        out = None
        for adj, x in zip(graph.blocks, xs):
            part = _mm(adj, x.to(adj.dtype).contiguous())
            out = part if out is None else out.add_(part)
        out = out.div_(graph.degree) if mean else out
        return out.to(xs[0].dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        graph = ctx.graph
        grad = grad.to(graph.degree.dtype)
        grad = grad / graph.degree if ctx.mean else grad.contiguous()
        grads = [_mm(adj_t, grad).to(dtype) if needed else None
                 for adj_t, dtype, needed in zip(graph.blocks_t, ctx.dtypes, ctx.needs_input_grad[2:])]
        return (None, None, *grads)


#: conv classes whose ``message_and_aggregate`` is ``spmm(adj_t, x[0] or x, reduce=self.aggr)``,
#: and whether their ``forward`` takes ``x`` as a (source rows, target rows) pair
def _known() -> dict[type, bool]:
    from torch_geometric.nn import GCNConv, GINConv, GraphConv, SAGEConv

    return {SAGEConv: True, GraphConv: True, GINConv: True, GCNConv: False}


def lean_kind(layer: nn.Module) -> str | None:
    """``"paired"`` (the conv takes ``(source rows, target rows)``: only owned rows come out, and
    owned and halo rows need not be concatenated), ``"square"``, or ``None`` when ``layer`` is not
    a conv whose aggregation :class:`SparseAggregate` reproduces (its class exactly, a sum or mean)."""
    paired = _known().get(type(layer))
    if paired is None or getattr(layer, "aggr", None) not in ("sum", "add", "mean"):
        return None
    if getattr(layer, "project", False):  # SAGEConv(project=True) transforms the source rows itself
        paired = False
    return "paired" if paired else "square"


def lean_message_and_aggregate(layer: nn.Module, graph: LeanAdjacency, rows: list[torch.Tensor] | None = None
                               ) -> Callable:
    """The ``message_and_aggregate`` to set on ``layer`` for one call. PyG calls it with the
    adjacency handed over as ``edge_index`` and the features; ``rows``: the source blocks to
    aggregate instead of the features' source rows (a paired conv is handed ``(owned, owned)``,
    whose source half matches the first block's columns, so owned and halo rows are never
    concatenated)."""
    mean = layer.aggr == "mean"

    def message_and_aggregate(adj_t, x=None, *args, **kwargs):
        if adj_t is not graph.adj:  # not the call it was set for (one that raised left it behind)
            return type(layer).message_and_aggregate(layer, adj_t, x, *args, **kwargs)
        blocks = rows if rows is not None else [x[0] if isinstance(x, tuple) else x]
        return SparseAggregate.apply(graph, mean, *blocks)

    return message_and_aggregate
