"""Reference LightningModules."""

from lightning_granndis.models.mlp import MLPClassifier

__all__ = ["MLPClassifier"]
