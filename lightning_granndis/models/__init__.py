"""Reference LightningModules."""

from lightning_granndis.models.gnn import GNNNodeClassifier
from lightning_granndis.models.gpt import GPT
from lightning_granndis.models.mlp import MLPClassifier

__all__ = ["GPT", "GNNNodeClassifier", "MLPClassifier"]
