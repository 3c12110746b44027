"""The subgraph one server trains on, in each GraNNDis mode (PACT'24, §5).

- :func:`preloaded_subgraph` — Flexible Preloading (§5.1): the inner vertices and every vertex
  they depend on within ``L`` hops, with all the edges those dependencies need. Exact.
- :func:`expansion_subgraph` — Expansion-aware Sampling (§5.3): every edge among the server's
  inner vertices is kept; only the expansion leaving the server is sampled, ``h`` hops with at
  most ``f`` external neighbours per vertex (degree-aware by default). External vertices
  aggregate over the selected vertices (a truncated neighbourhood: an approximation, unmasked).
- :func:`sampled_subgraph` — Cooperative Batching (§5.2): a server-sized co-batch of seeds and
  its layer-wise sampled ``L``-hop neighbourhood (fan-out per hop), masked per layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lightning_granndis.graph.fanouts import Fanout, resolve_fanouts
from lightning_granndis.graph.preload import preload_dependencies
from lightning_granndis.graph.sampling import CSRGraph, sample_subgraph


@dataclass
class ServerSubgraph:
    """A subgraph in local ids: ``n_id`` ``[n]`` global ids (inner/seed vertices first),
    ``edge_index`` ``[2, E]`` local, ``hop`` ``[n]``, ``seed`` ``[n]`` bool, and ``exact_hops``
    (``L`` when per-layer masks make the seeds' outputs exact, ``None`` for an approximation)."""

    n_id: torch.Tensor
    edge_index: torch.Tensor
    hop: torch.Tensor
    seed: torch.Tensor
    exact_hops: int | None

    @property
    def num_nodes(self) -> int:
        return int(self.n_id.numel())


def _local(n_id: torch.Tensor, num_nodes: int) -> torch.Tensor:
    local = torch.full((num_nodes,), -1, dtype=torch.long)
    local[n_id] = torch.arange(n_id.numel())
    return local


def _in_edges_within(graph: CSRGraph, n_id: torch.Tensor, targets: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """Every edge ``u → v`` with ``v = n_id[targets]`` and ``u`` in the subgraph, in local ids."""
    parts = []
    for chunk in graph.vertex_chunks(targets):  # bounded gathers: a closure can hold most of E
        owner, nbr = graph.neighbours(n_id[chunk])
        keep = local[nbr] >= 0
        parts.append(torch.stack([local[nbr[keep]], chunk[owner[keep]]]))
    return torch.cat(parts, 1) if parts else torch.empty(2, 0, dtype=torch.long)


def preloaded_subgraph(graph: CSRGraph, inner: torch.Tensor, hops: int) -> ServerSubgraph:
    """Flexible Preloading of ``inner`` for an ``hops``-layer model (exact)."""
    n_id, hop = preload_dependencies(graph, inner, hops)
    local = _local(n_id, graph.num_nodes)
    # vertices at the last hop are masked at every layer that reads them: their in-edges are unused
    targets = (hop < hops).nonzero().flatten()
    edge_index = _in_edges_within(graph, n_id, targets, local)
    return ServerSubgraph(n_id, edge_index, hop, hop == 0, exact_hops=hops)


def expansion_subgraph(
    graph: CSRGraph,
    inner: torch.Tensor,
    hops: int = 1,
    fanout: Fanout = 15,
    weighted: bool = True,
    generator: torch.Generator | None = None,
) -> ServerSubgraph:
    """Expansion-aware Sampling of ``inner``: all inner edges, sampled external expansion.

    Each inner vertex keeps every inner in-neighbour and at most ``fanout[0]`` external ones; each
    external vertex ``h`` hops out (``h < hops``) keeps at most ``fanout[h]`` new neighbours
    further out (an int: the same at every hop). Every external vertex then also aggregates over
    all its in-neighbours that were selected.
    """
    if hops < 1:
        raise ValueError(f"expansion-aware sampling needs eas_hops >= 1, got {hops}.")
    fanouts = resolve_fanouts(fanout, hops, 15, "eas fanout", "the expansion's hops (eas_hops)")
    inside = torch.zeros(graph.num_nodes, dtype=torch.bool)
    inside[inner] = True
    sub = sample_subgraph(graph, inner, fanouts, inside=inside, weighted=weighted, generator=generator)
    n_id, hop = sub.n_id, sub.hop
    local = _local(n_id, graph.num_nodes)
    src, dst = sub.edge_index
    to_inner = hop[dst] == 0
    external = (hop > 0).nonzero().flatten()
    edge_index = torch.cat([torch.stack([src[to_inner], dst[to_inner]]),
                            _in_edges_within(graph, n_id, external, local)], 1)
    return ServerSubgraph(n_id, edge_index, hop, hop == 0, exact_hops=None)


def sampled_subgraph(
    graph: CSRGraph,
    seeds: torch.Tensor,
    fanout: Fanout,
    hops: int,
    weighted: bool = False,
    generator: torch.Generator | None = None,
    inside: torch.Tensor | None = None,
) -> ServerSubgraph:
    """A co-batch: ``seeds`` and their layer-wise sampled ``hops``-hop neighbourhood (``fanout``:
    PyG's ``num_neighbors``, one entry per hop from the seeds out, or one int for every hop;
    ``-1`` = all), masked per layer like a stack of message-flow graphs. ``inside`` ``[N]`` bool
    (CoB with EAS sampling): edges among inside vertices are all kept, only the others sampled."""
    fanouts = resolve_fanouts(fanout, hops, 25)
    sub = sample_subgraph(graph, seeds, fanouts, inside=inside, weighted=weighted, generator=generator)
    return ServerSubgraph(sub.n_id, sub.edge_index, sub.hop, sub.seed_mask, exact_hops=hops)


def whole_graph(num_nodes: int, edge_index: torch.Tensor) -> ServerSubgraph:
    """The whole graph as one subgraph (full-graph training and exact inference)."""
    n_id = torch.arange(num_nodes)
    hop = torch.zeros(num_nodes, dtype=torch.long)
    return ServerSubgraph(n_id, edge_index, hop, torch.ones(num_nodes, dtype=torch.bool), exact_hops=None)
