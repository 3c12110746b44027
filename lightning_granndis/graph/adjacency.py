"""Sparse-matrix aggregation: a local graph as a ``torch.sparse`` CSR adjacency for PyG convs.

PyG's default message passing gathers one message per edge, an ``[E, F]`` tensor per layer (at
ogbn-products size, 124M edges x 100 features: a 49 GB request). Convs that implement
``message_and_aggregate`` (``SAGEConv``, ``GCNConv``, ``GraphConv``, ``GINConv``, ...) instead
compute :math:`\\text{out} = A^\\top X` as one sparse-dense product when handed a sparse
adjacency, so no per-edge tensor is built. PyG reads a sparse ``edge_index`` as the transposed
adjacency ``adj_t`` of shape ``[num_targets, num_sources]``: row ``v`` lists the sources of the
edges into ``v``. torch's own CSR is enough (no torch-sparse).

Duplicate edges are kept as separate entries (the CSR is not coalesced), so ``mean`` divides by
the same edge count as PyG's scatter over ``edge_index``, and ``max``/``min`` see the same set.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

#: reductions ``torch.sparse.mm`` computes on each device type (PyG's ``spmm``)
_REDUCTIONS = {"cpu": ("sum", "add", "mean", "min", "max"), "cuda": ("sum", "add", "mean")}


def csr_adjacency(edge_index: torch.Tensor, num_nodes: int, weight: torch.Tensor | None = None,
                  dtype: torch.dtype = torch.float32, num_cols: int | None = None) -> torch.Tensor:
    """``adj_t`` ``[num_nodes, num_cols]`` sparse CSR of ``edge_index`` (``source → target``): row
    ``v`` holds the sources of ``v``'s in-edges.

    Args:
        edge_index: ``[2, E]`` local ids, targets below ``num_nodes``, sources below ``num_cols``.
        num_nodes: rows (targets; square by default: owned plus halo rows, since a conv's root
            term reads every row).
        weight: ``[E]`` edge weights (default ones).
        dtype: value dtype (the features' dtype).
        num_cols: columns (sources; default ``num_nodes``).
    """
    num_cols = num_nodes if num_cols is None else num_cols
    src, dst = edge_index
    order = torch.argsort(dst * num_cols + src, stable=True)
    crow = torch.zeros(num_nodes + 1, dtype=torch.long, device=edge_index.device)
    crow[1:] = torch.cumsum(torch.bincount(dst, minlength=num_nodes), 0)
    values = (torch.ones(src.numel(), dtype=dtype, device=edge_index.device) if weight is None
              else weight[order].to(dtype))
    # built sorted by construction: invariant checks would only cost time. torch warns that sparse
    # CSR is "in beta" on every rank; we rely on it knowingly (the exactness tests cover it)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        return torch.sparse_csr_tensor(crow, src[order], values, (num_nodes, num_cols),
                                       check_invariants=False)


def supports_sparse_aggregation(layer: nn.Module, device: torch.device | str) -> bool:
    """Whether ``layer`` aggregates a sparse adjacency exactly as it aggregates ``edge_index``:
    it overrides ``message_and_aggregate`` and reduces with a string reduction ``torch.sparse.mm``
    has on ``device``. Convs that need per-edge messages (``GATConv``) do not."""
    from torch_geometric.nn import MessagePassing

    if type(layer).message_and_aggregate is MessagePassing.message_and_aggregate:
        return False
    aggr = getattr(layer, "aggr", None)
    return isinstance(aggr, str) and aggr in _REDUCTIONS.get(torch.device(device).type, ())
