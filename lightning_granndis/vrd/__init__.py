"""Visual relationship detection (Jung and Park, "Visual Relationship Detection with Language prior
and Softmax", arXiv 1904.07798): the spatial vector, Recall@K metrics, scene data."""

from lightning_granndis.vrd.spatial import box_iou_pairs, spatial_vector, union_boxes

__all__ = ["box_iou_pairs", "spatial_vector", "union_boxes"]
