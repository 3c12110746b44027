"""Graph algorithms in plain torch: validation, partitioning, neighbour sampling."""

from lightning_granndis.graph.validation import GraphValidationError, validate_graph

__all__ = ["GraphValidationError", "validate_graph"]
