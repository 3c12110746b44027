"""Graph algorithms in plain torch: validation, partitioning, neighbour sampling."""

from lightning_granndis.graph.partition import Partition, metis_partition, random_partition
from lightning_granndis.graph.sampling import CSRGraph, NeighborSampler, sample_subgraph
from lightning_granndis.graph.validation import GraphValidationError, validate_graph

__all__ = [
    "CSRGraph", "GraphValidationError", "NeighborSampler", "Partition", "metis_partition", "random_partition",
    "sample_subgraph", "validate_graph",
]
