"""Callbacks of the suite."""

from lightning_granndis.callbacks.comm_monitor import CommMonitor

__all__ = ["CommMonitor"]
