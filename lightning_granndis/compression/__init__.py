"""Compression of the traffic between pipeline stages and data-parallel replicas."""

from lightning_granndis.compression.low_rank import LowRankCompressor, as_matrix, orthogonalise

__all__ = ["LowRankCompressor", "as_matrix", "orthogonalise"]
