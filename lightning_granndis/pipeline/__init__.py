"""Pipeline parallelism: stage planning, schedules, the stage runtime, and the module protocol."""

from lightning_granndis.pipeline.checkpoint import consolidate_checkpoint
from lightning_granndis.pipeline.module import PipelinedModule
from lightning_granndis.pipeline.planner import Placement, StagePlan, place_stages, plan_stages
from lightning_granndis.pipeline.schedules import Action, build_schedule

__all__ = [
    "Action", "PipelinedModule", "Placement", "StagePlan", "build_schedule", "consolidate_checkpoint",
    "place_stages", "plan_stages",
]
