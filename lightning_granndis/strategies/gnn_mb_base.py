"""MB_base: per-device neighbour-sampled mini-batches with plain DDP (SALIENT++-style)."""

from __future__ import annotations

import math
from typing import Any

import torch
from typing_extensions import override

from lightning_granndis.graph.feature_fetch import fetch_plans
from lightning_granndis.graph.one_hop import OneHopGraph
from lightning_granndis.graph.partition import metis_partition
from lightning_granndis.graph.sampling import CSRGraph
from lightning_granndis.graph.server_subgraph import sampled_subgraph
from lightning_granndis.strategies.granndis import ServerAwareGNNStrategy


class MiniBatchBaselineStrategy(ServerAwareGNNStrategy):
    """The GraNNDis paper's MB_base (PACT'24, §8.1; `SALIENT++ <https://arxiv.org/abs/2305.19178>`_
    with GraphSAGE sampling).

    Every epoch the training vertices are shuffled and dealt to the ``P`` ranks; each rank trains
    on its own mini-batches of ``batch_size`` seeds with their sampled ``L``-hop neighbourhoods
    (``fanout`` per hop, default 25). Input features are partitioned across ranks (METIS), so the
    features a mini-batch needs from other ranks are fetched each iteration (booked as
    ``feature_fetch``). Gradients: plain DDP all-reduce. Mini-batches are sampled once at set-up,
    like the CoB co-batches they are compared with.

    Args:
        servers: servers (for the ledger's link classes).
        fanout: neighbours per hop (default 25).
        batch_size: seeds per device per iteration (default 1024).
        hierarchical: gradient sync (default ``False``: plain DDP).
        **kwargs: as :class:`ServerAwareGNNStrategy`.
    """

    strategy_name = "gnn_mb_base"
    default_mode = "minibatch"
    halo_scope = "none"

    def __init__(self, servers: int | None = None, fanout: int = 25, batch_size: int = 1024,
                 hierarchical: bool = False, **kwargs: Any) -> None:
        kwargs.pop("mode", None)
        super().__init__(servers=servers, mode="minibatch", fanout=fanout, batch_size=batch_size,
                         hierarchical=hierarchical, **kwargs)

    @classmethod
    @override
    def modes(cls) -> tuple[str, ...]:
        return ("minibatch",)

    @override
    def _train_plans(self, data) -> list[list[OneHopGraph]]:
        P, L = self.topology.world_size, self.num_layers
        graph = CSRGraph.from_edge_index(data.edge_index, data.num_nodes)
        owner_of = metis_partition(data.edge_index, data.num_nodes, P, train_mask=data.train_mask, seed=self.seed,
                                   cache_dir=self.cache_dir).assignment if P > 1 else torch.zeros(data.num_nodes, dtype=torch.long)
        generator = torch.Generator().manual_seed(self.seed)
        seeds = data.train_mask.nonzero().flatten()
        shards = torch.tensor_split(seeds[torch.randperm(seeds.numel(), generator=generator)], P)
        iterations = max(1, math.ceil(max(s.numel() for s in shards) / self.batch_size))
        plans: list[list[OneHopGraph]] = [[] for _ in range(P)]
        for it in range(iterations):
            subs = [sampled_subgraph(graph, torch.tensor_split(shards[r], iterations)[it], self.fanout, L,
                                     generator=generator) for r in range(P)]
            fetches = fetch_plans([s.n_id for s in subs], owner_of)
            for r, (sub, fetch) in enumerate(zip(subs, fetches)):
                n = sub.num_nodes
                plans[r].append(OneHopGraph(
                    n_owned=n, n_id=sub.n_id, edge_index=sub.edge_index, send_index=torch.empty(0, dtype=torch.long),
                    send_splits=[0] * P, recv_splits=[0] * P, hop=sub.hop, seed=sub.seed, exact_hops=L,
                    meta={"scope": "none", "purpose": "halo", "fetch": fetch, "iteration": it},
                ))
        return plans

    @override
    def training_step(self, *args: Any, **kwargs: Any):
        batch = args[0]
        fetch = self._graphs[int(batch.granndis_key)].meta["fetch"]
        # rows owned elsewhere are not ours to read: blank them, then fetch them from their owners
        x = batch.x.clone()
        x[fetch.recv_pos.to(x.device)] = 0
        rows = self._data.x[fetch.send_ids].to(x.device)
        received, _ = self.comm.all_to_all(rows, fetch.send_splits, "feature_fetch", recv_splits=fetch.recv_splits)
        x[fetch.recv_pos.to(x.device)] = received
        batch.x = x
        return super().training_step(batch, *args[1:], **kwargs)

    @classmethod
    @override
    def register_strategies(cls, strategy_registry) -> None:
        strategy_registry.register(cls.strategy_name, cls, override=True,
                                   description="MB_base: per-device sampled mini-batches (fan-out 25), plain DDP")
