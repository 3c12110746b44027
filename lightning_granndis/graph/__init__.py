"""Graph algorithms in plain torch: validation, partitioning, neighbour sampling, preloading."""

from lightning_granndis.graph.preload import exactness_masks, preload_dependencies
from lightning_granndis.graph.partition import Partition, metis_partition, random_partition
from lightning_granndis.graph.sampling import CSRGraph, NeighborSampler, sample_subgraph
from lightning_granndis.graph.validation import GraphValidationError, validate_graph

__all__ = [
    "CSRGraph", "GraphValidationError", "NeighborSampler", "Partition", "exactness_masks", "metis_partition",
    "preload_dependencies", "random_partition", "sample_subgraph", "validate_graph",
]
