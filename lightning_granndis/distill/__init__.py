"""Blockwise distillation (Pipe-BD, DATE'23) in plain torch: guide features, stage schedules,
teacher relaying, the per-rank step and Automatic Hybrid Distribution's search."""

from lightning_granndis.distill.ahd import BlockCosts, SearchResult, StageCostModel, search_schedule
from lightning_granndis.distill.blocks import TeacherCounter, check_blocks, guide_features
from lightning_granndis.distill.module import BlockwiseDistillation
from lightning_granndis.distill.runner import MODES, BlockwiseRunner
from lightning_granndis.distill.schedule import DistillSchedule, row_range

__all__ = [
    "BlockCosts", "BlockwiseDistillation", "BlockwiseRunner", "DistillSchedule", "MODES", "SearchResult",
    "StageCostModel", "TeacherCounter", "check_blocks", "guide_features", "row_range", "search_schedule",
]
