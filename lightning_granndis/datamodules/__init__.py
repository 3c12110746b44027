"""DataModules: real loaders with offline embedded defaults."""

from lightning_granndis.datamodules.digits import DigitsDataModule

__all__ = ["DigitsDataModule"]
