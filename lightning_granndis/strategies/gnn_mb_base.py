"""MB_base: per-device neighbour-sampled mini-batches with plain DDP (SALIENT++-style)."""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_granndis.graph.epoch_sampling import minibatch_epoch
from lightning_granndis.graph.feature_fetch import fetch_request
from lightning_granndis.strategies.granndis import ServerAwareGNNStrategy


class MiniBatchBaselineStrategy(ServerAwareGNNStrategy):
    """The GraNNDis paper's MB_base (PACT'24, §8.1; `SALIENT++ <https://arxiv.org/abs/2305.19178>`_
    with GraphSAGE sampling).

    Every epoch the training vertices are shuffled and dealt to the ``P`` ranks; each rank trains
    on its own mini-batches of ``batch_size`` seeds with their sampled ``L``-hop neighbourhoods
    (``fanout`` per hop, default 25). Input features are partitioned across ranks (METIS), so the
    features a mini-batch needs from other ranks are fetched each iteration (booked as
    ``feature_fetch``). Gradients: plain DDP all-reduce. Mini-batches are drawn afresh every epoch
    (seeded by epoch) by the same bounded background producer as CoB's co-batches.

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
    def _epoch_parts(self, shard, epoch: int, start: int = 0):
        return minibatch_epoch(shard.source, self.global_rank, self.world_size, self.fanout or 25, self.num_layers,
                               self.seed, epoch, start)

    @override
    def training_step(self, *args: Any, **kwargs: Any):
        batch = args[0]
        graph = self._graphs[int(batch.granndis_key)]
        source = self._shards_source()
        # rows owned elsewhere are not ours to read (blank in the batch): ask their owners for them
        request = fetch_request(graph.n_id.cpu(), graph.meta["owner"], self.global_rank, self.world_size)
        asked = self.comm.exchange_counts(request.splits, "feature_fetch")
        ids, _ = self.comm.all_to_all(request.ids, request.splits, "feature_fetch", recv_splits=asked)
        rows = source.x[source.x_row[ids]].to(batch.x.device)
        received, _ = self.comm.all_to_all(rows, asked, "feature_fetch", recv_splits=request.splits)
        x = batch.x.clone()
        x[request.pos.to(x.device)] = received
        batch.x = x
        return super().training_step(batch, *args[1:], **kwargs)

    def _shards_source(self):
        return next(iter(self._shards.values())).source

    @classmethod
    @override
    def register_strategies(cls, strategy_registry) -> None:
        strategy_registry.register(cls.strategy_name, cls, override=True,
                                   description="MB_base: per-device sampled mini-batches (fan-out 25), plain DDP")
