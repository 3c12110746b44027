"""The graph store: partition a graph offline once (:func:`partition_graph`), then let every rank
read only its own server's shard at run time (:func:`load_rank_shard`)."""

from lightning_granndis.graph.store.files import GraphStoreError, GraphStoreHandle, load_rank_shard, read_manifest
from lightning_granndis.graph.store.partition import partition_graph, store_params
from lightning_granndis.graph.store.shards import GraphPart, RankShard, SamplingSource, build_shards

__all__ = ["GraphPart", "GraphStoreError", "GraphStoreHandle", "RankShard", "SamplingSource", "build_shards", "load_rank_shard",
           "partition_graph", "read_manifest", "store_params"]
