"""DataModules: real loaders with offline embedded defaults."""

from lightning_granndis.datamodules.digits import DigitsDataModule
from lightning_granndis.datamodules.images import ImageDataModule
from lightning_granndis.datamodules.ogb import OGBNodeDataModule
from lightning_granndis.datamodules.text import TextDataModule

__all__ = ["DigitsDataModule", "ImageDataModule", "OGBNodeDataModule", "TextDataModule"]
