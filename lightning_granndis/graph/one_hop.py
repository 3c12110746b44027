"""One-hop graphs: a (server) subgraph split across devices, each device with a one-hop halo.

GraNNDis (PACT'24, §6, One-Hop Graph Masking): the subgraph a server trains on is partitioned
across its devices. Device ``p`` owns vertices :math:`O_p` and keeps every subgraph edge
:math:`u \\to v` with :math:`v \\in O_p`; the sources it does not own form its halo :math:`H_p`.
Before every message-passing layer each device sends the rows its peers need (one all-to-all, the
same plan every layer), so one one-hop graph serves all ``L`` layers. A per-layer mask zeroes the
vertices whose representation is not exact at that layer (a preloaded vertex at hop distance ``h``
is exact after ``l`` layers iff :math:`h \\le L - l`).

The same structure is the full-graph baseline (PipeGCN-vanilla): the whole graph split across all
ranks, with the halo exchanged among all of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch


@dataclass
class OneHopGraph:
    """One device's share of a partitioned subgraph.

    Local rows ``0 .. n_owned - 1`` are the owned vertices, rows ``n_owned ..`` the halo, ordered by
    owning peer (then by the peer's own order), so the rows received from an all-to-all append
    directly.

    Attributes:
        n_owned: owned vertices.
        n_id: ``[n_owned + n_halo]`` global vertex id of every local row.
        edge_index: ``[2, E]`` local ids, ``source → target``, every target owned.
        send_index: ``[sum(send_splits)]`` owned rows to send, grouped by destination peer.
        send_splits: rows sent to each peer of the group (``0`` for itself).
        recv_splits: halo rows received from each peer (``0`` from itself).
        hop: ``[n_owned]`` hop distance of each owned vertex from the subgraph's inner vertices.
        seed: ``[n_owned]`` owned vertices whose outputs count (loss, predictions).
        exact_hops: ``L`` when the subgraph holds every ``L``-hop dependency (masks apply), else
            ``None`` (a sampled approximation: no masking).
        halo_hop: ``[n_halo]`` hop distance of each halo row (what :meth:`layer_trim` needs to
            cut the halo per layer); ``None`` where unknown (no trimming).
    """

    n_owned: int
    n_id: torch.Tensor
    edge_index: torch.Tensor
    send_index: torch.Tensor
    send_splits: list[int]
    recv_splits: list[int]
    hop: torch.Tensor
    seed: torch.Tensor
    exact_hops: int | None = None
    meta: dict = field(default_factory=dict)
    halo_hop: torch.Tensor | None = None

    @property
    def n_halo(self) -> int:
        return int(self.n_id.numel()) - self.n_owned

    def input_masks(self, num_layers: int) -> list[torch.Tensor | None]:
        """``masks[k]``: owned rows to zero in the *input* of layer ``k`` (0-based), i.e. the
        vertices whose layer-``k`` representation is not exact (``hop > L - k``); ``None`` where
        nothing is masked."""
        if self.exact_hops is None:
            return [None] * num_layers
        masks: list[torch.Tensor | None] = []
        for k in range(num_layers):
            mask = self.hop > self.exact_hops - k
            masks.append(mask if bool(mask.any()) else None)
        return masks

    def layer_edge_index(self, k: int, num_layers: int) -> torch.Tensor:
        """The edges layer ``k`` (0-based) needs: for an exact subgraph only those into vertices whose
        layer-``k`` output is still exact (``hop <= L - 1 - k``); the others would be masked at the
        next layer anyway, so their aggregation is skipped. Approximate subgraphs use every edge."""
        if self.exact_hops is None:
            return self.edge_index
        cache = self.__dict__.setdefault("_layer_edges", {})
        if (k, num_layers) not in cache:
            keep = self.hop[self.edge_index[1]] <= self.exact_hops - 1 - k
            cache[(k, num_layers)] = self.edge_index if bool(keep.all()) else self.edge_index[:, keep]
        return cache[(k, num_layers)]

    def trimmable(self) -> bool:
        """Whether :meth:`layer_trim` applies: an exact graph whose owned rows, and each peer's
        block of halo rows, come in hop order (sampled batches and co-batches do), so the rows a
        layer still needs are a prefix of each."""
        if self.exact_hops is None or (self.halo_hop is None and self.n_halo):
            return False
        blocks = [self.hop, *(self.halo_hop.split(self.recv_splits) if self.n_halo else [])]
        return all(b.numel() < 2 or bool((b[1:] >= b[:-1]).all()) for b in blocks)

    def layer_trim(self, k: int) -> "LayerTrim":
        """Layer ``k``'s (0-based) rows when layers are trimmed (PyG's ``trim_to_layer``): it reads
        the rows within ``L - k`` hops (owned and halo) and computes the owned rows within
        ``L - 1 - k`` hops, whose outputs are exact; the rest would be masked anyway. Needs
        :meth:`trimmable`."""
        cache = self.__dict__.setdefault("_trims", {})
        if k not in cache:
            cache[k] = LayerTrim.build(self, k)
        return cache[k]

    def to(self, device: torch.device | str) -> "OneHopGraph":
        move = {name: getattr(self, name).to(device) for name in ("n_id", "edge_index", "send_index", "hop", "seed")}
        return OneHopGraph(self.n_owned, send_splits=self.send_splits, recv_splits=self.recv_splits,
                           exact_hops=self.exact_hops, meta=self.meta,
                           halo_hop=None if self.halo_hop is None else self.halo_hop.to(device), **move)


@dataclass
class LayerTrim:
    """One layer's rows under trimming (see :meth:`OneHopGraph.layer_trim`).

    Attributes:
        n_in: owned rows the layer reads (a prefix: hop ``<= L - k``).
        n_out: owned rows it computes (hop ``<= L - 1 - k``).
        plan: the graph with this layer's send/receive plan (each peer's block cut to its rows
            within ``L - k`` hops), what the halo exchange is handed.
        halo_map: ``[n_halo]`` each halo row's position among the rows received, ``-1`` if not.
    """

    n_in: int
    n_out: int
    plan: OneHopGraph
    halo_map: torch.Tensor

    @classmethod
    def build(cls, graph: OneHopGraph, k: int) -> "LayerTrim":
        reach = graph.exact_hops - k
        n_in, n_out = int((graph.hop <= reach).sum()), int((graph.hop <= reach - 1).sum())
        sends = [b[graph.hop[b] <= reach] for b in graph.send_index.split(graph.send_splits)]
        halo_map = torch.full((graph.n_halo,), -1, dtype=torch.long, device=graph.hop.device)
        recv, start, kept = [], 0, 0
        for size in graph.recv_splits:
            count = int((graph.halo_hop[start:start + size] <= reach).sum()) if size else 0
            halo_map[start:start + count] = torch.arange(kept, kept + count, device=halo_map.device)
            recv.append(count)
            start, kept = start + size, kept + count
        send_index = torch.cat(sends) if sends else graph.send_index
        plan = replace(graph, send_index=send_index, send_splits=[int(b.numel()) for b in sends], recv_splits=recv)
        return cls(n_in, n_out, plan, halo_map)

    def edges(self, graph: OneHopGraph, edge_index: torch.Tensor, weight: torch.Tensor | None
              ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``edge_index`` (local ids of ``graph``) into the layer's computed rows, re-indexed to
        its rows: the owned rows read, then the halo rows received."""
        src, dst = edge_index
        keep = dst < self.n_out
        src, dst = src[keep], dst[keep]
        halo = src >= graph.n_owned
        moved = src.clone()
        moved[halo] = self.n_in + self.halo_map[src[halo] - graph.n_owned]
        if bool(((moved >= self.n_in) & ~halo).any()) or bool((halo & (moved < self.n_in)).any()):
            raise ValueError("a trimmed layer's edge reads a row beyond its hops: the graph's rows are not in "
                             "hop order (trim_layers needs sampled batches as the sampler builds them).")
        return torch.stack([moved, dst]), None if weight is None else weight[keep]


class OneHopSplit:
    """A subgraph's split into ``num_parts`` one-hop graphs, each built on demand.

    Every part's halo (a vertex set: what the send plans need) is found at once; a part's edges
    and rows only when :meth:`graph` asks for it, so a caller that stores and drops one part at a
    time never holds all parts' edges (at ogbn-products size 0.5 GB each).

    Args:
        edge_index: ``[2, E]`` subgraph edges in subgraph-local ids ``0 .. n - 1``.
        n_id: ``[n]`` global id of each subgraph vertex.
        owner: ``[n]`` part (device slot) owning each vertex.
        num_parts: number of parts ``G``.
        hop: ``[n]`` hop distance from the inner vertices (default: all ``0``).
        seed: ``[n]`` bool, vertices whose outputs count (default: ``hop == 0``).
        exact_hops: ``L`` if the subgraph holds every ``L``-hop dependency of its seeds.
    """

    def __init__(self, edge_index: torch.Tensor, n_id: torch.Tensor, owner: torch.Tensor, num_parts: int,
                 hop: torch.Tensor | None = None, seed: torch.Tensor | None = None,
                 exact_hops: int | None = None) -> None:
        n = int(n_id.numel())
        self.hop = torch.zeros(n, dtype=torch.long) if hop is None else hop
        self.seed = (self.hop == 0) if seed is None else seed
        if owner.numel() != n or (n and (int(owner.min()) < 0 or int(owner.max()) >= num_parts)):
            raise ValueError(f"owner must give a part in [0, {num_parts}) for each of the {n} vertices.")
        self.edge_index, self.n_id, self.owner, self.num_parts, self.exact_hops = edge_index, n_id, owner, num_parts, exact_hops
        self.owned = [(owner == p).nonzero().flatten() for p in range(num_parts)]
        self.position = torch.empty(n, dtype=torch.long)  # index of a vertex among its owner's rows
        for rows in self.owned:
            self.position[rows] = torch.arange(rows.numel())
        src, dst = edge_index
        self.halos = []
        for p in range(num_parts):
            s = src[owner[dst] == p]
            halo = torch.unique(s[owner[s] != p])
            self.halos.append(halo[torch.argsort(owner[halo] * n + self.position[halo])])

    def graph(self, p: int) -> OneHopGraph:
        """Part ``p``'s one-hop graph; send/receive plans match the other parts' pairwise."""
        n, owner, halo = int(self.n_id.numel()), self.owner, self.halos[p]
        src, dst = self.edge_index
        keep = owner[dst] == p
        s, d = src[keep], dst[keep]
        local = torch.full((n,), -1, dtype=torch.long)
        local[self.owned[p]] = torch.arange(self.owned[p].numel())
        local[halo] = self.owned[p].numel() + torch.arange(halo.numel())
        recv = [int((owner[halo] == q).sum()) for q in range(self.num_parts)]
        sends, send_splits = [], []
        for q in range(self.num_parts):
            wanted = self.halos[q][owner[self.halos[q]] == p]  # already in p's row order
            sends.append(self.position[wanted])
            send_splits.append(int(wanted.numel()))
        rows = torch.cat([self.owned[p], halo])
        return OneHopGraph(
            n_owned=int(self.owned[p].numel()), n_id=self.n_id[rows], edge_index=torch.stack([local[s], local[d]]),
            send_index=torch.cat(sends) if sends else torch.empty(0, dtype=torch.long),
            send_splits=send_splits, recv_splits=recv, hop=self.hop[self.owned[p]], seed=self.seed[self.owned[p]],
            exact_hops=self.exact_hops, halo_hop=self.hop[halo],
        )


def split_one_hop(
    edge_index: torch.Tensor,
    n_id: torch.Tensor,
    owner: torch.Tensor,
    num_parts: int,
    hop: torch.Tensor | None = None,
    seed: torch.Tensor | None = None,
    exact_hops: int | None = None,
) -> list[OneHopGraph]:
    """Splits a subgraph into ``num_parts`` one-hop graphs (all of them; see :class:`OneHopSplit`
    for the arguments and for one part at a time).

    Returns:
        ``G`` :class:`OneHopGraph`, whose send/receive plans match pairwise.
    """
    split = OneHopSplit(edge_index, n_id, owner, num_parts, hop, seed, exact_hops)
    return [split.graph(p) for p in range(num_parts)]


def simulate_exchange(graphs: list[OneHopGraph], owned_rows: list[torch.Tensor]) -> list[torch.Tensor]:
    """In one process: every part's owned rows followed by the halo rows its peers would send
    (what the all-to-all produces). For tests and single-process checks."""
    out = []
    for p, g in enumerate(graphs):
        received = []
        for q, peer in enumerate(graphs):
            start = sum(peer.send_splits[:p])
            rows = peer.send_index[start:start + peer.send_splits[p]]
            received.append(owned_rows[q][rows])
        out.append(torch.cat([owned_rows[p], *received]))
    return out
