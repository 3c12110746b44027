"""Compression of the traffic between pipeline stages and data-parallel replicas."""

from lightning_granndis.compression.low_rank import LowRankCompressor, as_matrix, low_rank_pays, orthogonalise
from lightning_granndis.compression.powersgd import PowerSGDReducer

__all__ = ["LowRankCompressor", "PowerSGDReducer", "as_matrix", "low_rank_pays", "orthogonalise"]
