"""MB_base: per-device neighbour-sampled mini-batches with plain DDP (SALIENT++-style)."""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_granndis.graph.epoch_sampling import minibatch_epoch, minibatch_steps
from lightning_granndis.graph.feature_fetch import fetch_request
from lightning_granndis.strategies.granndis import ServerAwareGNNStrategy


class MiniBatchBaselineStrategy(ServerAwareGNNStrategy):
    """The GraNNDis paper's MB_base (PACT'24, §8.1; `SALIENT++ <https://arxiv.org/abs/2305.19178>`_
    with GraphSAGE sampling).

    Every epoch the training vertices are shuffled and dealt to the ``P`` ranks as PyG + DDP deals
    them (Lightning's ``DistributedSampler`` + ``NeighborLoader``): step ``k`` is the permutation's
    ``k``-th global batch of ``P * batch_size`` seeds, each rank taking every ``P``-th, so an epoch
    has ``ceil(N / (P * batch_size))`` steps; each rank trains on its ``batch_size`` seeds with
    their sampled ``L``-hop neighbourhoods (``fanout``: PyG's ``num_neighbors``, default 25 per
    hop). Input features are partitioned across ranks (METIS), so the
    features a mini-batch needs from other ranks are fetched each iteration (booked as
    ``feature_fetch``). Gradients: plain DDP all-reduce. Mini-batches are drawn afresh every epoch
    (seeded by epoch) by the same bounded background producer as CoB's co-batches.

    Args:
        servers: servers (for the ledger's link classes).
        fanout: neighbours per hop: one entry per message-passing layer (``[15, 10, 5]``, ``-1`` =
            all) or one int for every hop (default 25, the paper's MB_base).
        batch_size: seeds per rank per step (default 1024; global batch ``P * batch_size``).
        hierarchical: gradient sync (default ``False``: plain DDP).
        **kwargs: as :class:`ServerAwareGNNStrategy`.
    """

    strategy_name = "gnn_mb_base"
    default_mode = "minibatch"
    halo_scope = "none"

    def __init__(self, servers: int | None = None, fanout: int | list[int] = 25, batch_size: int = 1024,
                 hierarchical: bool = False, **kwargs: Any) -> None:
        kwargs.pop("mode", None)
        super().__init__(servers=servers, mode="minibatch", fanout=fanout, batch_size=batch_size,
                         hierarchical=hierarchical, **kwargs)

    @classmethod
    @override
    def modes(cls) -> tuple[str, ...]:
        return ("minibatch",)

    @override
    def _steps_per_epoch(self, source) -> int:
        steps = minibatch_steps(source, self.world_size, self.batching)
        self._say_steps(steps, sum(source.seed_counts), None)
        return steps

    @override
    def _epoch_parts(self, shard, epoch: int, start: int = 0):
        return minibatch_epoch(shard.source, self.global_rank, self.world_size, self.fanouts, self.batching,
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
        # batch.x is this batch's own gathered copy: filled in place, never copied again
        batch.x[request.pos.to(batch.x.device)] = received
        return super().training_step(batch, *args[1:], **kwargs)

    def _shards_source(self):
        return next(iter(self._shards.values())).source

    @classmethod
    @override
    def register_strategies(cls, strategy_registry) -> None:
        strategy_registry.register(cls.strategy_name, cls, override=True,
                                   description="MB_base: per-rank sampled mini-batches (PyG + DDP batching), plain DDP")
