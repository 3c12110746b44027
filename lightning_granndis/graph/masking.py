"""One-Hop Graph Masking around unmodified PyG ``MessagePassing`` layers (GraNNDis, PACT'24, §6).

:class:`OneHopMasking` hooks every message-passing layer of a model. While a
:class:`~lightning_granndis.graph.one_hop.OneHopGraph` is active, the layer's input ``x``
(``[n_owned, F]``) is

1. masked: rows whose representation is not exact at this layer are zeroed;
2. extended by the halo rows, exchanged with the peers (an autograd-aware all-to-all, so halo
   gradients flow back to their owners);

and the layer's output is cut back to the owned rows. The user's model never sees the halo.

With ``trim_layers`` (sampled batches, PyG's ``trim_to_layer``) rows are dropped instead of
zeroed: layer ``k`` of ``L`` reads the rows within ``L - k`` hops of the seeds and computes those
within ``L - 1 - k``, so a batch's activations shrink hop by hop (its last hop is most of its
vertices) and the seeds' outputs are unchanged.

GCN's symmetric normalisation :math:`\\hat{A} = D^{-1/2}(A + I)D^{-1/2}` needs every vertex's
*global* degree, which a device's local graph does not have: for ``GCNConv`` the hook passes edge
weights computed from the global degrees and switches the layer's own normalisation off for that
call, so results stay exact.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from lightning_granndis.graph.adjacency import csr_adjacency, supports_sparse_aggregation
from lightning_granndis.graph.lean_aggregation import LeanAdjacency, lean_kind, lean_message_and_aggregate
from lightning_granndis.graph.one_hop import OneHopGraph

Exchange = Callable[[torch.Tensor, OneHopGraph], torch.Tensor]


def message_passing_layers(module: nn.Module) -> list[nn.Module]:
    """The outermost PyG ``MessagePassing`` modules of ``module``, in definition order.

    Raises:
        ValueError: when there is none (the strategy has nothing to distribute).
    """
    from torch_geometric.nn import MessagePassing

    layers: list[nn.Module] = []

    def visit(m: nn.Module) -> None:
        for child in m.children():
            if isinstance(child, MessagePassing):
                layers.append(child)
            else:
                visit(child)

    if isinstance(module, MessagePassing):
        return [module]
    visit(module)
    if not layers:
        raise ValueError(
            f"{type(module).__name__} has no torch_geometric MessagePassing layer (SAGEConv, GCNConv, GATConv, "
            "GraphConv, ...): the GNN strategies distribute message passing and have nothing to do here. "
            "Use strategy='server_aware_ddp' or 'ddp' for other models."
        )
    return layers


def degree_stats(edge_index: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """``[N, 3]``: every vertex's in-degree without self loops, whether it has a self loop, and its
    in-degree with them — what GCN's normalisation needs from the whole graph."""
    src, dst = edge_index
    loops = torch.bincount(dst[src == dst], minlength=num_nodes)  # loops are few: no E-sized copy
    degree = torch.bincount(dst, minlength=num_nodes)
    return torch.stack([degree - loops, (loops > 0).long(), degree], 1)


def gcn_degree(stats: torch.Tensor, fill_value: float = 1.0, add_self_loops: bool = True) -> torch.Tensor:
    """The degree ``GCNConv`` normalises with. With self loops PyG's ``add_remaining_self_loops``
    keeps one loop per vertex (an existing loop keeps weight 1, a new one gets ``fill_value``)."""
    if not add_self_loops:
        return stats[:, 2].double()
    return stats[:, 0].double() + torch.where(stats[:, 1] > 0, 1.0, float(fill_value))


def local_gcn_edges(graph: OneHopGraph, degree: torch.Tensor, fill_value: float = 1.0,
                    add_self_loops: bool = True, edge_index: torch.Tensor | None = None,
                    by_row: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``graph``'s edges as ``GCNConv`` would see them (one self loop per owned vertex) and their
    weights :math:`w_{uv} / \\sqrt{d_u d_v}` from whole-graph degrees ``degree`` (by global id, or
    one per local row with ``by_row``). ``edge_index`` overrides the graph's edges (a layer's pruned
    subset)."""
    edge_index = (graph.edge_index if edge_index is None else edge_index).cpu()
    weight = torch.ones(edge_index.shape[1], dtype=torch.double)
    if add_self_loops:
        src, dst = edge_index
        loop = src == dst
        has_loop = torch.zeros(graph.n_owned, dtype=torch.bool)
        has_loop[dst[loop]] = True
        owned = torch.arange(graph.n_owned)
        edge_index = torch.cat([edge_index[:, ~loop], torch.stack([owned, owned])], 1)
        loop_weight = torch.where(has_loop, 1.0, float(fill_value)).double()
        weight = torch.cat([weight[~loop], loop_weight])
    d = (degree if by_row else degree[graph.n_id.cpu()]).double().cpu()
    inv = torch.where(d > 0, d.rsqrt(), torch.zeros_like(d))
    src, dst = edge_index
    return edge_index, weight * inv[src] * inv[dst]


class OneHopMasking:
    """Installs the masking/halo hooks on every message-passing layer of ``module``.

    Args:
        module: the user's model (unmodified).
        exchange: ``exchange(rows, graph)`` → the halo rows received (autograd-aware).
        num_layers: ``L`` for the masks (default: the number of message-passing layers).
        degree_stats: ``[N, 3]`` whole-graph degree statistics for ``GCNConv`` (see
            :func:`degree_stats`); required when the model has one.
        sparse_aggregation: hand layers that can aggregate a sparse adjacency a ``torch.sparse``
            CSR ``adj_t`` instead of ``edge_index`` (no ``[E, F]`` message tensor; default ``True``;
            see :mod:`~lightning_granndis.graph.adjacency`). Others keep ``edge_index``.
        lean_aggregation: for the sum/mean convs PyG ships (``SAGEConv``, ``GraphConv``,
            ``GINConv``, ``GCNConv``), aggregate with
            :class:`~lightning_granndis.graph.lean_aggregation.SparseAggregate` (saves only the
            graph for backward) and, where the conv takes a pair, compute only the owned rows
            (default ``True``; needs ``sparse_aggregation``).
        trim_layers: on graphs that allow it (:meth:`OneHopGraph.trimmable`: sampled batches),
            layer ``k`` reads only the rows within ``L - k`` hops and computes only those within
            ``L - 1 - k`` (PyG's ``trim_to_layer``): the rows between layers shrink hop by hop,
            the seeds' outputs are the same, and the last layer's output is padded back to a row
            per vertex with zeros. Needs one call per layer, in order, each fed the previous
            layer's output (default ``False``).
    """

    def __init__(self, module: nn.Module, exchange: Exchange, num_layers: int | None = None,
                 degree_stats: torch.Tensor | None = None, sparse_aggregation: bool = True,
                 lean_aggregation: bool = True, trim_layers: bool = False) -> None:
        self.layers = message_passing_layers(module)
        self.index = {id(layer): k for k, layer in enumerate(self.layers)}
        self.num_layers = num_layers or len(self.layers)
        self.exchange = exchange
        self.degree_stats = degree_stats
        self.graph: OneHopGraph | None = None
        self._masks: list[torch.Tensor | None] = []
        self.sparse_aggregation, self.lean_aggregation = sparse_aggregation, lean_aggregation
        self.set_trim(trim_layers)
        self._handles = []
        for layer in self.layers:
            self._handles.append(layer.register_forward_pre_hook(self._before, with_kwargs=True))
            self._handles.append(layer.register_forward_hook(self._after, with_kwargs=True))

    def activate(self, graph: OneHopGraph | None) -> None:
        """Routes the next forward passes through ``graph`` (``None``: hooks pass through)."""
        if graph is not self.graph:
            self.graph = graph
            self._masks = graph.input_masks(self.num_layers) if graph is not None else []
            self._trim = self.trim_layers and graph is not None and graph.trimmable()

    def set_trim(self, on: bool) -> bool:
        """Trims layers from now on (see ``trim_layers``); returns whether it applies: the model
        must have one message-passing layer per hop (one call each, in order)."""
        self.trim_layers = bool(on) and self.num_layers == len(self.layers)
        self._trim = self.trim_layers and self.graph is not None and self.graph.trimmable()
        return self.trim_layers

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    # ------------------------------------------------------------------ hooks
    def _before(self, layer: nn.Module, args: tuple, kwargs: dict):
        graph = self.graph
        if graph is None:
            return None
        args, kwargs = list(args), dict(kwargs)
        x = args[0] if args else kwargs.pop("x")
        k = self.index[id(layer)]
        trim = graph.layer_trim(k) if self._trim else None
        if not isinstance(x, torch.Tensor) or (x.shape[0] != graph.n_owned if trim is None else x.shape[0] < trim.n_in):
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            rows = (f"one tensor of {graph.n_owned} rows" if trim is None else
                    f"one tensor of at least {trim.n_in} rows (trim_layers: the previous layer's output)")
            raise ValueError(
                f"{type(layer).__name__} got x of shape {got}; under a GNN strategy every message-passing layer "
                f"must receive the rank's vertex features as {rows} (bipartite tuples are not supported)."
            )
        plan, n_dst = graph, graph.n_owned
        if trim is not None:  # the rows beyond the layer's hops are the ones a mask would zero
            x, plan, n_dst = x[: trim.n_in], trim.plan, trim.n_out
        else:
            mask = self._masks[k] if k < len(self._masks) else None
            if mask is not None:
                x = x.masked_fill(mask.unsqueeze(-1), 0.0)
        halo = self.exchange(x[plan.send_index], plan)
        edge_index, weight = self._layer_edges(layer, args, kwargs, graph, k)
        if trim is not None:
            edge_index, weight = self._trimmed_edges(graph, trim, edge_index, weight)
        lean = None
        if self.sparse_aggregation and supports_sparse_aggregation(layer, x.device) and not _extra_inputs(args, kwargs):
            lean = lean_kind(layer) if self.lean_aggregation else "csr"
        if lean == "paired":  # owned and halo rows stay apart: only the computed owned rows come out
            n_src = x.shape[0]
            adjacency = self._adjacency(graph, edge_index, weight, lean, x.dtype,
                                        lambda: LeanAdjacency.build(edge_index, n_dst, [n_src, halo.shape[0]],
                                                                    weight, x.dtype))
            layer.message_and_aggregate = lean_message_and_aggregate(layer, adjacency, [x, halo])
            x, edge_index, weight = (x, x[:n_dst]), adjacency.adj, None
        else:
            x = torch.cat([x, halo], 0)
            n = x.shape[0]
            if lean == "square":
                adjacency = self._adjacency(graph, edge_index, weight, lean, x.dtype,
                                            lambda: LeanAdjacency.build(edge_index, n, [n], weight, x.dtype))
                layer.message_and_aggregate = lean_message_and_aggregate(layer, adjacency)
                edge_index, weight = adjacency.adj, None
            elif lean == "csr":
                edge_index = self._adjacency(graph, edge_index, weight, lean, x.dtype,
                                             lambda: csr_adjacency(edge_index, n, weight, x.dtype))
                weight = None
        if args:
            args[0] = x
        else:
            kwargs["x"] = x
        if len(args) > 1:
            args[1] = edge_index
        else:
            kwargs["edge_index"] = edge_index
        if weight is not None:
            args[2:] = []
            kwargs["edge_weight"] = weight.to(x.dtype)
        return tuple(args), kwargs

    @staticmethod
    def _trimmed_edges(graph: OneHopGraph, trim, edge_index: torch.Tensor, weight: torch.Tensor | None):
        """``edge_index`` and ``weight`` re-indexed to ``trim``'s rows, once per graph and edges."""
        cache = graph.__dict__.setdefault("_trimmed_edges", {})
        key = (id(trim), id(edge_index), None if weight is None else id(weight))
        if key not in cache:
            cache[key] = trim.edges(graph, edge_index, weight)
        return cache[key]

    @staticmethod
    def _adjacency(graph: OneHopGraph, edge_index: torch.Tensor, weight: torch.Tensor | None, kind: str,
                   dtype: torch.dtype, build):
        """The adjacency of ``edge_index`` for ``graph``, built once; keyed by the edge tensors
        themselves (cached on the graph, so alive with it): layers sharing their edges (graphs
        without per-layer pruning) share one adjacency."""
        cache = graph.__dict__.setdefault("_adjacency", {})
        key = (id(edge_index), None if weight is None else id(weight), kind, dtype)
        if key not in cache:
            cache[key] = build()
        return cache[key]

    def _layer_edges(self, layer: nn.Module, args: list, kwargs: dict, graph: OneHopGraph,
                     k: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Layer ``k``'s local edges and, for a normalising ``GCNConv``, their weights from the
        whole graph's degrees (the layer's own normalisation is switched off for the call)."""
        from torch_geometric.nn import GCNConv

        edge_index = graph.layer_edge_index(k, self.num_layers)
        if not isinstance(layer, GCNConv) or not layer.normalize:
            return edge_index, None
        if (len(args) > 2 and args[2] is not None) or kwargs.get("edge_weight") is not None:
            raise ValueError("GCNConv with edge weights is not supported under the GNN strategies.")
        local_stats = graph.meta.get("degree_stats")  # [n_local, 3], one row per local row
        if self.degree_stats is None and local_stats is None:
            raise ValueError("GCNConv needs the whole graph's degrees: pass degree_stats to OneHopMasking.")
        fill = 2.0 if layer.improved else 1.0
        key = (k, fill, layer.add_self_loops)
        cache = graph.__dict__.setdefault("_gcn_edges", {})
        if key not in cache:
            stats = self.degree_stats if local_stats is None else local_stats
            degree = gcn_degree(stats, fill, layer.add_self_loops)
            gcn_edges, weight = local_gcn_edges(graph, degree, fill, layer.add_self_loops, edge_index,
                                                by_row=local_stats is not None)
            cache[key] = (gcn_edges.to(edge_index.device), weight.to(edge_index.device))
        layer.normalize = False  # restored in _after
        layer._granndis_normalize = True
        kwargs.pop("edge_weight", None)
        args[2:] = []
        return cache[key]

    def _after(self, layer: nn.Module, args: tuple, kwargs: dict, output):
        graph = self.graph
        if graph is None:
            return None
        layer.__dict__.pop("message_and_aggregate", None)  # the lean aggregation of this call
        if getattr(layer, "_granndis_normalize", False):
            layer.normalize = True
            layer._granndis_normalize = False
        if not isinstance(output, torch.Tensor):
            raise ValueError(f"{type(layer).__name__} returned {type(output).__name__}; under a GNN strategy "
                             "message-passing layers must return one tensor (no attention weights).")
        if not self._trim:
            return output[: graph.n_owned]
        k = self.index[id(layer)]
        output = output[: graph.layer_trim(k).n_out]
        if k == len(self.layers) - 1 and output.shape[0] < graph.n_owned:
            # a row per vertex again, as the batch's masks and labels index it (the padding is not
            # a seed: losses and predictions never read it)
            output = torch.cat([output, output.new_zeros(graph.n_owned - output.shape[0], *output.shape[1:])])
        return output


def _extra_inputs(args: list, kwargs: dict) -> bool:
    """Whether a conv call carries per-edge inputs besides ``x`` and ``edge_index`` (they index
    edges in ``edge_index``'s order, which a CSR reorders)."""
    return any(a is not None for a in args[2:]) or any(v is not None for key, v in kwargs.items()
                                                       if key not in ("x", "edge_index", "size"))
