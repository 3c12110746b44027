"""A CSR neighbour sampler in plain, vectorised torch.

PyG's ``NeighborLoader`` needs pyg-lib or torch-sparse, which have no wheels for the torch this
package is built with; this sampler stands in. It grows a subgraph hop by hop from seed vertices
(each newly reached vertex is expanded once, as in ShaDow-style subgraph sampling), keeping per
hop either every neighbour (``fanout=-1``) or ``fanout`` of them drawn without replacement,
uniformly (GraphSAGE) or proportionally to the neighbour's degree.

For GraNNDis' Expansion-aware Sampling (PACT'24, §5.3), a vertex set ``inside`` can be given:
edges between two inside vertices are always kept, and only edges leaving the set count against
the fan-out.

No Python loop runs over vertices: per hop, the frontier's neighbour lists are gathered with
``repeat_interleave``, random keys are drawn for every candidate edge, and the ``fanout`` smallest
keys of each vertex are found with one sort.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lightning_granndis.graph.csr import csr_from_sorted_keys, sorted_keys


@dataclass
class CSRGraph:
    """In-neighbour lists: the neighbours of ``v`` are ``col[rowptr[v]:rowptr[v + 1]]``, i.e. the
    sources ``u`` of edges ``u → v`` (PyG's ``source_to_target`` flow). ``col`` is ``int32``
    where the ids fit (half the bytes of the graph's largest array: at ogbn-products size 0.5 GB
    instead of 1 GB per process that holds it); :meth:`neighbours` hands out ``int64`` ids."""

    rowptr: torch.Tensor
    col: torch.Tensor
    num_nodes: int

    @classmethod
    def from_edge_index(cls, edge_index: torch.Tensor, num_nodes: int) -> "CSRGraph":
        src, dst = edge_index
        # neighbours in ascending order (a sort of dst * N + src) without an argsort's index array
        rowptr, col = csr_from_sorted_keys(sorted_keys(dst, src, num_nodes), num_nodes)
        if num_nodes < 2**31 - 1:
            col = col.to(torch.int32)
        return cls(rowptr, col, num_nodes)

    @property
    def degree(self) -> torch.Tensor:
        return self.rowptr[1:] - self.rowptr[:-1]

    def vertex_chunks(self, vertices: torch.Tensor, slots: int = 2**23) -> list[torch.Tensor]:
        """``vertices`` in consecutive pieces of about ``slots`` neighbour slots each, so gathering
        a large set's neighbours piece by piece keeps every temporary bounded."""
        total = int((self.rowptr[vertices + 1] - self.rowptr[vertices]).sum()) if vertices.numel() else 0
        return list(torch.tensor_split(vertices, max(1, -(-total // slots))))

    def neighbours(self, vertices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(owner, neighbour)`` of every neighbour slot of ``vertices``; ``owner`` indexes
        ``vertices``."""
        starts = self.rowptr[vertices]
        deg = self.rowptr[vertices + 1] - starts
        owner = torch.repeat_interleave(torch.arange(len(vertices)), deg)
        # slot i of vertex k sits at starts[k] + (i - first slot of k): one gather of the shifts
        shift = (starts - (torch.cumsum(deg, 0) - deg))[owner]
        return owner, self.col[shift.add_(torch.arange(owner.numel()))].long()


def _smallest_k_per_group(group: torch.Tensor, keys: torch.Tensor, k: int) -> torch.Tensor:
    """Bool mask of the ``k`` smallest ``keys`` (in ``[0, 1)``) within each ``group`` id.

    One sort of ``group + key`` (float64 keeps ~1e-10 resolution of the key for a million groups).
    """
    order = torch.argsort(group.double() + keys)
    g = group[order]
    first = torch.ones_like(g, dtype=torch.bool)
    first[1:] = g[1:] != g[:-1]
    start_pos = torch.cummax(torch.where(first, torch.arange(len(g)), torch.zeros_like(g)), 0).values
    chosen = torch.zeros_like(keys, dtype=torch.bool)
    chosen[order[torch.arange(len(g)) - start_pos < k]] = True
    return chosen


def _sample_neighbours(graph: CSRGraph, frontier: torch.Tensor, k: int, inside: torch.Tensor | None,
                       weighted: bool, deg: torch.Tensor, generator: torch.Generator | None):
    """``(source, target)`` of the edges kept into ``frontier``: every inside-to-inside edge and
    ``k`` of the others per vertex (uniformly or degree-aware)."""
    owner, nbr = graph.neighbours(frontier)
    always = torch.zeros(len(nbr), dtype=torch.bool)
    if inside is not None:
        always = inside[frontier][owner] & inside[nbr]
    cand = (~always).nonzero().flatten()
    u = torch.rand(len(cand), generator=generator, dtype=torch.float64).clamp_min(1e-300)
    if weighted:
        # Efraimidis–Spirakis: the k smallest -log(u)/w are a weighted sample without
        # replacement; 1 - exp(-t) maps them into [0, 1) keeping their order.
        keys = -torch.expm1(torch.log(u) / deg[nbr[cand]].double().clamp_min(1.0))
    else:
        keys = u
    keep = always
    keep[cand[_smallest_k_per_group(owner[cand], keys, k)]] = True
    return nbr[keep], frontier[owner[keep]]


def sample_subgraph(
    graph: CSRGraph,
    seeds: torch.Tensor,
    fanouts: list[int],
    inside: torch.Tensor | None = None,
    weighted: bool = False,
    induced: bool = False,
    generator: torch.Generator | None = None,
):
    """Samples the multi-hop neighbourhood of ``seeds``.

    Args:
        graph: the graph in CSR.
        seeds: ``[S]`` distinct vertex ids.
        fanouts: neighbours kept per vertex at each hop (``-1`` = all); ``len(fanouts)`` hops.
        inside: ``[N]`` bool; edges between two inside vertices are always kept and do not count
            against the fan-out (expansion-aware sampling).
        weighted: choose neighbours with probability proportional to their degree (the paper's
            degree-aware choice) instead of uniformly.
        induced: return every graph edge among the reached vertices, not only the sampled ones.
        generator: random generator (for determinism).

    Returns:
        A PyG ``Data`` with ``n_id`` ``[n]`` (global ids, seeds first), ``edge_index`` ``[2, e]`` in
        local ids (``source → target``, messages flow from a neighbour to the vertex that sampled
        it), ``seed_mask`` ``[n]`` bool, ``hop`` ``[n]`` long (distance from the seeds in the
        sample), and ``num_nodes``.
    """
    from torch_geometric.data import Data

    n = graph.num_nodes
    seeds = seeds.long()
    hop = torch.full((n,), -1, dtype=torch.long)
    hop[seeds] = 0
    layers, frontier = [seeds], seeds
    src_parts, dst_parts = [], []
    deg = graph.degree
    for h, k in enumerate(fanouts, start=1):
        if frontier.numel() == 0:
            break
        if k < 0:  # every neighbour: no mask, no copy
            owner, nbr = graph.neighbours(frontier)
            src_parts.append(nbr)
            dst_parts.append(frontier[owner])
        else:
            # the frontier in pieces of bounded neighbour slots: a large frontier's candidate
            # edges (ids, keys, sort) would otherwise cost ~100 bytes per slot at once
            picked_src, picked_dst = [], []
            for piece in graph.vertex_chunks(frontier, slots=2**21):
                src_k, dst_k = _sample_neighbours(graph, piece, k, inside, weighted, deg, generator)
                picked_src.append(src_k)
                picked_dst.append(dst_k)
            src_parts.append(torch.cat(picked_src) if len(picked_src) != 1 else picked_src[0])
            dst_parts.append(torch.cat(picked_dst) if len(picked_dst) != 1 else picked_dst[0])
        src = src_parts[-1]
        fresh = src[hop[src] < 0]
        if fresh.numel() > n // 64:  # a large frontier: a vertex mask dedupes in O(n), no sort
            mark = torch.zeros(n, dtype=torch.bool)
            mark[fresh] = True
            new = mark.nonzero().flatten()  # sorted, as torch.unique's
        else:
            new = torch.unique(fresh)
        hop[new] = h
        layers.append(new)
        frontier = new
    n_id = torch.cat(layers)
    local = torch.full((n,), -1, dtype=torch.long)
    local[n_id] = torch.arange(len(n_id))
    if induced and all(k < 0 for k in fanouts):
        # the expanded layers' in-edges were all kept (every source is reached, every vertex is
        # expanded once), so only the last, unexpanded layer's in-edges remain to be filtered
        owner, nbr = graph.neighbours(frontier if len(src_parts) == len(fanouts) else frontier[:0])
        nbr = local[nbr]
        inset = nbr >= 0
        src_parts.append(n_id[nbr[inset]])
        dst_parts.append(frontier[owner[inset]])
    elif induced:
        owner, nbr = graph.neighbours(n_id)
        nbr = local[nbr]
        inset = nbr >= 0
        src_parts, dst_parts = [n_id[nbr[inset]]], [n_id[owner[inset]]]
    edge_index = torch.empty(2, sum(len(p) for p in src_parts), dtype=torch.long)
    if src_parts:
        torch.index_select(local, 0, torch.cat(src_parts), out=edge_index[0])
        torch.index_select(local, 0, torch.cat(dst_parts), out=edge_index[1])
    seed_mask = torch.zeros(len(n_id), dtype=torch.bool)
    seed_mask[: len(seeds)] = True
    return Data(n_id=n_id, edge_index=edge_index, seed_mask=seed_mask, hop=hop[n_id], num_nodes=len(n_id))


class NeighborSampler:
    """Mini-batches of seed vertices with their sampled neighbourhoods, as PyG ``Data``.

    Args:
        data: the graph (``x``, ``edge_index``, ``y`` and masks are sliced into each batch).
        fanouts: neighbours per hop, e.g. ``[25, 10]`` (GraphSAGE) or ``[-1, -1]``.
        batch_size: seeds per batch.
        input_nodes: ``[N]`` bool or vertex ids to draw seeds from (default: ``data.train_mask``).
        shuffle: shuffle seeds every epoch (default ``True``).
        weighted, induced: as in :func:`sample_subgraph`.
        seed: random seed; each epoch draws from it advanced by the epoch count.

    Each batch carries ``x``, ``y``, the masks, ``n_id``, ``seed_mask`` and ``hop``; compute the loss on
    ``batch.seed_mask``.
    """

    def __init__(self, data, fanouts: list[int], batch_size: int = 1024, input_nodes=None, shuffle: bool = True,
                 weighted: bool = False, induced: bool = False, seed: int = 0) -> None:
        self.data, self.fanouts, self.batch_size = data, list(fanouts), batch_size
        self.graph = CSRGraph.from_edge_index(data.edge_index, data.num_nodes)
        nodes = data.train_mask if input_nodes is None else input_nodes
        if nodes.dtype == torch.bool:
            nodes = nodes.nonzero().flatten()
        self.input_nodes = nodes
        self.shuffle, self.weighted, self.induced, self.seed = shuffle, weighted, induced, seed
        self._epoch = 0

    def __len__(self) -> int:
        return (len(self.input_nodes) + self.batch_size - 1) // self.batch_size

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed + self._epoch)
        self._epoch += 1
        nodes = self.input_nodes[torch.randperm(len(self.input_nodes), generator=g)] if self.shuffle else self.input_nodes
        for batch in nodes.split(self.batch_size):
            sub = sample_subgraph(self.graph, batch, self.fanouts, weighted=self.weighted, induced=self.induced,
                                  generator=g)
            for key in ("x", "y", "train_mask", "val_mask", "test_mask"):
                value = getattr(self.data, key, None)
                if value is not None:
                    sub[key] = value[sub.n_id]
            yield sub
