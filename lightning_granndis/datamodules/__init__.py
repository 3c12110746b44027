"""DataModules: real loaders with offline embedded defaults."""

from lightning_granndis.datamodules.digits import DigitsDataModule
from lightning_granndis.datamodules.dataset_partition import partition_dataset
from lightning_granndis.datamodules.graph_store import GraphStoreDataModule
from lightning_granndis.datamodules.images import ImageDataModule
from lightning_granndis.datamodules.ogb import OGBNodeDataModule
from lightning_granndis.datamodules.text import TextDataModule
from lightning_granndis.datamodules.visual_genome import VisualGenomeDataModule
from lightning_granndis.datamodules.vrd import VRDDataModule

__all__ = ["DigitsDataModule", "GraphStoreDataModule", "ImageDataModule", "OGBNodeDataModule", "TextDataModule", "VRDDataModule", "VisualGenomeDataModule", "partition_dataset"]
