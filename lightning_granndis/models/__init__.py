"""Reference LightningModules."""

from lightning_granndis.models.gnn import GNNNodeClassifier
from lightning_granndis.models.gpt import GPT
from lightning_granndis.models.image_classifier import ImageClassifier
from lightning_granndis.models.image_distillation import ImageBlockwiseDistillation
from lightning_granndis.models.mlp import MLPClassifier
from lightning_granndis.models.vrd import VisualRelationshipModel

__all__ = ["GPT", "GNNNodeClassifier", "ImageBlockwiseDistillation", "ImageClassifier", "MLPClassifier", "VisualRelationshipModel"]
