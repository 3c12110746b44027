"""Training plans: which one-hop graph every rank trains on, per mode and iteration.

A plan is computed once (by rank 0) from the whole graph and handed to the ranks: ``plans[r]``
is rank ``r``'s list of :class:`OneHopGraph` (one per iteration of an epoch). Server ``s`` holds
ranks ``s*G .. s*G+G-1``; the server-level split is METIS (min-cut, balanced on training
vertices) — the paper's §5.3.1 choice, where the artifact used a contiguous split of training ids.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from lightning_granndis.graph.one_hop import OneHopGraph, OneHopSplit, split_one_hop
from lightning_granndis.graph.partition import metis_partition
from lightning_granndis.graph.sampling import CSRGraph
from lightning_granndis.graph.server_subgraph import (
    ServerSubgraph,
    expansion_subgraph,
    preloaded_subgraph,
    sampled_subgraph,
    whole_graph,
)

MODES = ("flx", "cob", "eas")


@dataclass
class PlanConfig:
    """What to build.

    Attributes:
        mode: ``flx``, ``cob``, ``eas`` or ``full`` (the whole graph split across all ranks).
        servers: ``S``; devices_per_server: ``G``.
        hops: message-passing layers ``L``.
        fanout: CoB fan-out per hop (default 25) / EAS external fan-out (default 15).
        eas_hops: EAS expansion hops ``h`` (default 1).
        weighted: degree-aware EAS choice (default ``True``; ``False`` = uniform).
        batch_size: CoB seeds per device per iteration (co-batch = ``G * batch_size``).
        iterations: CoB iterations per epoch (overrides ``batch_size``).
        seed: random seed.
        resample: ``"once"`` (the paper: sampled plans drawn at set-up) or ``"epoch"`` (EAS's
            expansion redrawn every epoch).
    """

    mode: str
    servers: int
    devices_per_server: int
    hops: int
    fanout: int | None = None
    eas_hops: int = 1
    weighted: bool = True
    batch_size: int = 1024
    iterations: int | None = None
    seed: int = 0
    cache_dir: str | None = None
    resample: str = "once"


def server_assignment(edge_index: torch.Tensor, num_nodes: int, servers: int, train_mask: torch.Tensor,
                      seed: int = 0, cache_dir: str | None = None) -> torch.Tensor:
    """``[N]`` server of every vertex (METIS, balanced on vertices and training vertices)."""
    return metis_partition(edge_index, num_nodes, servers, train_mask=train_mask, seed=seed,
                           cache_dir=cache_dir).assignment


def inner_metis_owner(sub: ServerSubgraph, devices: int, seed: int = 0, cache_dir: str | None = None,
                      balance: torch.Tensor | None = None) -> torch.Tensor:
    """``[n]`` device of every vertex of a server subgraph ``sub``: METIS over the server's inner
    vertices (``hop == 0``; balanced on ``balance``, default ``sub.seed``), and each outer vertex
    goes with a neighbour one hop nearer the inner set (the one with the lowest local id).

    METIS over the whole subgraph costs far more where the subgraph reaches far out: at
    ogbn-products size a 2-hop closure of half the graph is the whole graph, and METIS over it (or
    over an EAS expansion of half of it) needs ~12 GB; over the inner vertices alone, a fraction.
    """
    n = sub.num_nodes
    if devices == 1:
        return torch.zeros(n, dtype=torch.long)
    hop = sub.hop
    inner = (hop == 0).nonzero().flatten()
    index = torch.full((n,), -1, dtype=torch.long)
    index[inner] = torch.arange(inner.numel())
    src, dst = sub.edge_index
    among = (hop[src] == 0) & (hop[dst] == 0)
    inner_edges = torch.stack([index[src[among]], index[dst[among]]])
    del among
    owner = torch.full((n,), -1, dtype=torch.long)
    owner[inner] = metis_partition(inner_edges, inner.numel(), devices, train_mask=(sub.seed if balance is None else balance)[inner], seed=seed,
                                   cache_dir=cache_dir).assignment
    del inner_edges
    for h in range(1, int(hop.max()) + 1 if n else 0):
        # an edge u -> v with u one hop further out than v: u was reached from v
        out = (hop[src] == h) & (hop[dst] == h - 1)
        nearest = torch.full((n,), n, dtype=torch.long).scatter_reduce(0, src[out], dst[out], "amin")
        reached = (hop == h).nonzero().flatten()
        owner[reached] = owner[nearest[reached]]
    return owner


def split_across_devices(sub: ServerSubgraph, devices: int, seed: int = 0, cache_dir: str | None = None,
                         inner_only: bool = False) -> list[OneHopGraph]:
    """METIS-partitions a server subgraph across its ``devices``, balanced on seed vertices
    (cached by content in ``cache_dir``, when given); with ``inner_only`` METIS sees only the inner
    vertices and the others follow them (:func:`inner_metis_owner`)."""
    if devices == 1:
        owner = torch.zeros(sub.num_nodes, dtype=torch.long)
    elif inner_only:
        owner = inner_metis_owner(sub, devices, seed, cache_dir)
    else:
        owner = metis_partition(sub.edge_index, sub.num_nodes, devices, train_mask=sub.seed, seed=seed,
                                cache_dir=cache_dir).assignment
    return split_one_hop(sub.edge_index, sub.n_id, owner, devices, sub.hop, sub.seed, sub.exact_hops)


def full_graph_split(edge_index: torch.Tensor, num_nodes: int, world_size: int, train_mask: torch.Tensor | None,
                     seed: int = 0, cache_dir: str | None = None) -> OneHopSplit:
    """The whole graph split across all ranks (METIS), halo among all of them: one graph per rank,
    each built when asked for. Consecutive METIS parts go to consecutive ranks, as PipeGCN does (no
    server awareness)."""
    owner = metis_partition(edge_index, num_nodes, world_size, train_mask=train_mask, seed=seed,
                            cache_dir=cache_dir).assignment if world_size > 1 else torch.zeros(num_nodes, dtype=torch.long)
    sub = whole_graph(num_nodes, edge_index)
    return OneHopSplit(sub.edge_index, sub.n_id, owner, world_size, sub.hop, sub.seed, None)


def cob_iterations(server_of: torch.Tensor, train_mask: torch.Tensor, cfg: PlanConfig) -> int:
    """Iterations per epoch: every server runs the same number (collectives line up)."""
    if cfg.iterations is not None:
        return max(1, int(cfg.iterations))
    per_server = torch.bincount(server_of[train_mask], minlength=cfg.servers)
    return max(1, math.ceil(int(per_server.max()) / (cfg.batch_size * cfg.devices_per_server)))


def server_plans(data, cfg: PlanConfig, server_of: torch.Tensor, graph: CSRGraph | None = None,
                 progress: bool = True) -> Iterator[list[list[OneHopGraph]]]:
    """Server by server (``0 .. S-1``), the plan of each of its ``G`` devices: ``G`` lists of one-hop
    graphs, one per iteration of an epoch. A caller that stores and drops each server's plans holds
    one server's at a time. Arguments as :func:`build_plan`."""
    if cfg.mode not in MODES:
        raise ValueError(f"unknown mode {cfg.mode!r}; choose one of {', '.join(MODES)}.")
    graph = graph or CSRGraph.from_edge_index(data.edge_index, data.num_nodes)
    S, G = cfg.servers, cfg.devices_per_server
    generator = torch.Generator().manual_seed(cfg.seed)  # one stream, drawn server after server
    iterations = cob_iterations(server_of, data.train_mask, cfg) if cfg.mode == "cob" else 1
    steps = tqdm(total=S * iterations, desc=f"granndis: building {cfg.mode} plan", disable=not progress, leave=False)
    for s in range(S):
        yield _server_plan(data, cfg, graph, (server_of == s).nonzero().flatten(), s, iterations, generator, steps)
    steps.close()


def _server_plan(data, cfg: PlanConfig, graph: CSRGraph, inner: torch.Tensor, s: int, iterations: int,
                 generator: torch.Generator, steps) -> list[list[OneHopGraph]]:
    G = cfg.devices_per_server
    if cfg.mode == "cob":
        seeds = inner[data.train_mask[inner]]
        seeds = seeds[torch.randperm(seeds.numel(), generator=generator)]
        chunks = torch.tensor_split(seeds, iterations)
    devices: list[list[OneHopGraph]] = [[] for _ in range(G)]
    for it in range(iterations):
        if cfg.mode == "flx":
            sub = preloaded_subgraph(graph, inner, cfg.hops)
        elif cfg.mode == "eas":
            sub = expansion_subgraph(graph, inner, cfg.eas_hops, cfg.fanout or 15, cfg.weighted, generator)
        else:
            sub = sampled_subgraph(graph, chunks[it], cfg.fanout or 25, cfg.hops, generator=generator)
        sizes = dict(server_vertices=sub.num_nodes, server_edges=int(sub.edge_index.shape[1]))
        # one METIS per server for FLX/EAS is worth caching, CoB's per co-batch ones are not; an EAS
        # expansion's sampled fringe follows the inner vertices METIS splits
        split = split_across_devices(sub, G, seed=cfg.seed, cache_dir=None if cfg.mode == "cob" else cfg.cache_dir,
                                     inner_only=cfg.mode == "eas")
        del sub  # the split holds what is needed
        for d, one_hop in enumerate(split):
            one_hop.meta.update(server=s, iteration=it, **sizes)
            devices[d].append(one_hop)
        steps.update()
    return devices


def build_plan(data, cfg: PlanConfig, server_of: torch.Tensor, graph: CSRGraph | None = None,
               progress: bool = True) -> list[list[OneHopGraph]]:
    """``plans[rank]``: the one-hop graphs of every iteration of an epoch for that rank.

    Args:
        data: the whole graph (``edge_index``, ``num_nodes``, ``train_mask``).
        cfg: the plan configuration.
        server_of: ``[N]`` server of every vertex (:func:`server_assignment`).
        graph: in-neighbour CSR of ``data`` (built if not given).
    """
    return [plan for devices in server_plans(data, cfg, server_of, graph, progress) for plan in devices]
