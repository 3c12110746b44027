"""Callbacks of the suite."""

from lightning_granndis.callbacks.comm_monitor import CommMonitor
from lightning_granndis.callbacks.peak_memory import PeakMemory
from lightning_granndis.callbacks.relationship_plot import RelationshipPredictionsPlot
from lightning_granndis.callbacks.replica_snapshot import ReplicaSnapshot
from lightning_granndis.callbacks.resumable_checkpoint import ResumableCheckpoint
from lightning_granndis.callbacks.step_timer import StepTimer

__all__ = ["CommMonitor", "PeakMemory", "RelationshipPredictionsPlot", "ReplicaSnapshot", "ResumableCheckpoint", "StepTimer"]
