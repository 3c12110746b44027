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

from dataclasses import dataclass, field

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

    def to(self, device: torch.device | str) -> "OneHopGraph":
        move = {name: getattr(self, name).to(device) for name in ("n_id", "edge_index", "send_index", "hop", "seed")}
        return OneHopGraph(self.n_owned, send_splits=self.send_splits, recv_splits=self.recv_splits,
                           exact_hops=self.exact_hops, meta=self.meta, **move)


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
            exact_hops=self.exact_hops,
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
