"""What one rank trains and evaluates on: its :class:`RankShard`, built from the whole graph.

The offline partitioning step (:func:`~lightning_granndis.graph.store.partition_graph`) builds the
shards once and writes them per server; the in-memory path (a small graph every rank loaded) has
rank 0 build them and hand each rank its own. Either way a rank ends up with the same object:

- ``train``: its one-hop graphs for the fixed plans (FLX, EAS sampled once, FB_base), each with the
  features, labels and masks of the rows it owns and the degree statistics GCN needs;
- ``eval``: its part of the exact full-graph split (all ranks, halos among all of them);
- ``source``: for modes that sample every epoch (CoB, EAS ``resample="epoch"``, MB_base), what
  sampling needs: the server's ``L``-hop closure as an in-neighbour CSR in local ids with its rows'
  data and the device that owns each vertex when a (co-)batch is split.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from lightning_granndis.graph.masking import degree_stats
from lightning_granndis.graph.one_hop import OneHopGraph, OneHopSplit
from lightning_granndis.graph.partition import metis_partition
from lightning_granndis.graph.plan import PlanConfig, full_graph_split, inner_metis_owner, server_assignment, server_plans
from lightning_granndis.graph.sampling import CSRGraph
from lightning_granndis.graph.server_subgraph import preloaded_subgraph

SPLITS = ("train_mask", "val_mask", "test_mask")
#: what a store (and :func:`build_shards`) can be made for: the GraNNDis modes, FB_base, MB_base
MODES = ("flx", "eas", "cob", "full", "minibatch")


@dataclass
class GraphPart:
    """One rank's one-hop graph with the data of its rows.

    Attributes:
        graph: the one-hop graph (local rows: owned, then halo).
        x: ``[n_owned, F]`` features of the owned rows (halo rows arrive by exchange).
        y: ``[n_owned]`` labels; masks: ``{split: [n_owned] bool}`` limited to seed rows.
        degree: ``[n_local, 3]`` whole-graph degree statistics of every local row (GCN).
        weight: loss weight ``n_r P / N`` of this rank's seeds in the iteration.
        gather: for a sampled part, ``x`` is ``None`` and ``gather()`` reads the rows when the
            batch is used: parts waiting in the sampler's queue then hold ids and edges, not
            features (at ogbn-products size a co-batch part's rows are ~0.5 GB).
    """

    graph: OneHopGraph
    x: torch.Tensor | None
    y: torch.Tensor
    masks: dict[str, torch.Tensor]
    degree: torch.Tensor
    weight: float = 1.0
    gather: Callable[[], torch.Tensor] | None = None

    def features(self) -> torch.Tensor:
        """``[n_owned, F]``: the owned rows' features."""
        return self.x if self.x is not None else self.gather()


@dataclass
class SamplingSource:
    """What per-epoch sampling reads on one server (or, for MB_base, one rank).

    Attributes:
        csr: in-neighbour lists in local ids (every vertex sampling can expand).
        n_id: ``[n]`` global id of each local vertex.
        seeds: local ids of the training seeds this server (rank) draws from.
        owner: ``[n]`` device (rank, for MB_base) that owns a vertex when a batch is split.
        x: features of the vertices held here: every local vertex for a server, only the rank's
            own METIS part for MB_base (the others are fetched from their owners).
        x_row: ``[n]`` row of ``x`` holding each local vertex (``-1``: held by another rank), or
            ``None`` when ``x`` has a row per local vertex.
        y: ``[n]`` labels, degree: ``[n, 3]`` degree statistics.
        inner: local ids of the server's own vertices (EAS keeps their edges whole).
        seed_counts: training seeds of every server (rank): each epoch's per-iteration totals
            follow from them, for the loss weights, without communication.
        iterations: (co-)batches per epoch, the same on every rank.
    """

    csr: CSRGraph
    n_id: torch.Tensor
    seeds: torch.Tensor
    owner: torch.Tensor
    x: torch.Tensor
    y: torch.Tensor
    degree: torch.Tensor
    seed_counts: list[int]
    iterations: int
    x_row: torch.Tensor | None = None
    inner: torch.Tensor | None = None


@dataclass
class RankShard:
    rank: int
    server: int
    device: int
    train: list[GraphPart]
    eval: GraphPart
    source: SamplingSource | None = None
    meta: dict = field(default_factory=dict)


def graph_part(graph: OneHopGraph, data, stats: torch.Tensor, weight: float = 1.0) -> GraphPart:
    owned = graph.n_id[: graph.n_owned]
    masks = {k: getattr(data, k)[owned] & graph.seed for k in SPLITS if getattr(data, k, None) is not None}
    return GraphPart(graph, data.x[owned].contiguous(), data.y[owned].contiguous(), masks,
                     stats[graph.n_id].contiguous(), weight)


def seed_weights(counts: torch.Tensor) -> torch.Tensor:
    """``[P, iterations]`` loss weights ``n_r P / N`` from the seed counts ``n_r`` of every rank
    and iteration: the factor turning a rank's mean loss over its ``n_r`` seeds into its share of
    the mean over all ``N`` seeds of the iteration (DDP then averages over the ``P`` ranks)."""
    counts = counts.double()
    return counts * counts.shape[0] / counts.sum(0).clamp_min(1)


def chunk_sizes(count: int, chunks: int) -> list[int]:
    """The sizes :func:`torch.tensor_split` cuts ``count`` items into."""
    return [count // chunks + (1 if i < count % chunks else 0) for i in range(chunks)]


def iterations_for(seed_counts: list[int], seeds_per_batch: int, iterations: int | None) -> int:
    if iterations is not None:
        return max(1, int(iterations))
    return max(1, math.ceil(max(seed_counts, default=0) / max(1, seeds_per_batch)))


def eval_split(data, world_size: int, seed: int = 0, cache_dir: str | None = None) -> OneHopSplit:
    return full_graph_split(data.edge_index, data.num_nodes, world_size, data.train_mask, seed, cache_dir)


def eval_graph(split: OneHopSplit, rank: int, **meta) -> OneHopGraph:
    graph = split.graph(rank)
    graph.meta.update(scope="world", purpose="eval", **meta)
    return graph


def server_source(data, csr: CSRGraph, inner: torch.Tensor, cfg: PlanConfig, seed_counts: list[int],
                  stats: torch.Tensor, hops: int | None = None) -> SamplingSource:
    """A server's sampling source: its inner vertices' ``hops``-hop closure (default ``L``: every
    vertex a sampled co-batch can reach), split across the server's devices once
    (:func:`~lightning_granndis.graph.plan.inner_metis_owner`, balanced on its training seeds)."""
    sub = preloaded_subgraph(csr, inner, hops or cfg.hops)
    inner_local = (sub.hop == 0).nonzero().flatten()
    seeds = inner_local[data.train_mask[sub.n_id[inner_local]]]
    G = cfg.devices_per_server
    owner = inner_metis_owner(sub, G, cfg.seed, cfg.cache_dir, balance=data.train_mask[sub.n_id])
    local_csr = CSRGraph.from_edge_index(sub.edge_index, sub.num_nodes)
    n_id = sub.n_id
    del sub  # the closure's edge list: the CSR holds them now
    iterations = iterations_for(seed_counts, cfg.batch_size * G, cfg.iterations)
    return SamplingSource(local_csr, n_id, seeds, owner, data.x[n_id].contiguous(), data.y[n_id].contiguous(),
                          stats[n_id], seed_counts, iterations, inner=inner_local)


def minibatch_source(data, csr: CSRGraph, owner_of: torch.Tensor, rank: int, world_size: int, cfg: PlanConfig,
                     stats: torch.Tensor) -> SamplingSource:
    """MB_base's source for one rank: the whole graph's structure (SALIENT++ keeps it on every
    device), the training seeds dealt to the rank, and only its own METIS part's features."""
    train = data.train_mask.nonzero().flatten()
    counts = chunk_sizes(train.numel(), world_size)
    mine = (owner_of == rank).nonzero().flatten()
    x_row = torch.full((data.num_nodes,), -1, dtype=torch.long)
    x_row[mine] = torch.arange(mine.numel())
    iterations = iterations_for(counts, cfg.batch_size, cfg.iterations)
    return SamplingSource(csr, torch.arange(data.num_nodes), train, owner_of, data.x[mine].contiguous(), data.y,
                          stats, counts, iterations, x_row)


def build_shards(data, cfg: PlanConfig, progress: bool = False) -> Iterator[list[RankShard]]:
    """The shards of every rank, one server at a time (``S`` lists of ``G``), so a writer can
    stream them to disk. ``cfg.mode``: ``flx``, ``eas``, ``cob``, ``full`` (FB_base) or
    ``minibatch`` (MB_base).

    Beside the whole graph and its CSR, only the server being yielded is in memory: its plans,
    eval parts and sampling source are built when it is yielded, so a writer that stores and drops
    them holds one server's data, not every server's."""
    S, G = cfg.servers, cfg.devices_per_server
    P = S * G
    if cfg.mode not in MODES:
        raise ValueError(f"unknown mode {cfg.mode!r}; choose one of {', '.join(MODES)}.")
    stats = degree_stats(data.edge_index, data.num_nodes)
    csr = CSRGraph.from_edge_index(data.edge_index, data.num_nodes)
    evals = eval_split(data, P, cfg.seed, cfg.cache_dir)
    sampled_source = cfg.mode == "cob" or (cfg.mode == "eas" and cfg.resample == "epoch")
    server_of = counts = plans = weights = None
    n_train = int(data.train_mask.sum())
    if cfg.mode == "full":
        seeds = torch.tensor([[int(data.train_mask[rows].sum())] for rows in evals.owned])
        weights = seed_weights(seeds)[:, 0].tolist()
    elif cfg.mode != "minibatch":
        server_of = server_assignment(data.edge_index, data.num_nodes, S, data.train_mask, cfg.seed, cfg.cache_dir)
        counts = torch.bincount(server_of[data.train_mask], minlength=S).tolist()
        if not sampled_source:  # FLX, EAS sampled once: every inner training vertex is a seed once
            plans = server_plans(data, cfg, server_of, csr, progress=progress)
    for s in range(S):
        source = server_plan = None
        if sampled_source:
            # the EAS expansion reads in-edges up to eas_hops out: an (eas_hops + 1)-hop closure holds them
            hops = cfg.eas_hops + 1 if cfg.mode == "eas" else None
            source = server_source(data, csr, (server_of == s).nonzero().flatten(), cfg, counts, stats, hops)
        elif plans is not None:
            server_plan = next(plans)
        shards = [_rank_shard(data, cfg, csr, stats, evals, s, d, server_plan, source, weights, n_train)
                  for d in range(G)]
        del source, server_plan  # the shards hold them: dropped with the shards once written
        yield shards
        del shards


def _rank_shard(data, cfg: PlanConfig, csr: CSRGraph, stats: torch.Tensor, evals: OneHopSplit, s: int, d: int,
                server_plan: list[list[OneHopGraph]] | None, source: SamplingSource | None,
                weights: list[float] | None, n_train: int) -> RankShard:
    P = cfg.servers * cfg.devices_per_server
    r = s * cfg.devices_per_server + d
    eval_part = graph_part(eval_graph(evals, r), data, stats)
    train: list[GraphPart] = []
    if cfg.mode == "full":
        train = [GraphPart(**{**eval_part.__dict__, "weight": weights[r]})]
        train[0].graph = _with_meta(eval_part.graph, scope="world", purpose="halo")
    elif server_plan is not None:
        for g in server_plan[d]:
            g.meta.update(scope="intra", purpose="halo")
            part = graph_part(g, data, stats)
            # every training vertex is an inner seed of one server: n_r P / N with N all of them
            part.weight = float(part.masks["train_mask"].sum()) * P / max(1, n_train)
            train.append(part)
    if cfg.mode == "minibatch":
        source = minibatch_source(data, csr, evals.owner, r, P, cfg, stats)
    return RankShard(r, s, d, train, eval_part, source)


def _with_meta(graph: OneHopGraph, **meta) -> OneHopGraph:
    out = OneHopGraph(graph.n_owned, graph.n_id, graph.edge_index, graph.send_index, graph.send_splits,
                      graph.recv_splits, graph.hop, graph.seed, graph.exact_hops, {**graph.meta, **meta})
    return out
