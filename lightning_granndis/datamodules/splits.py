"""The DataLoaders of a DataModule whose data sits in ``self.splits`` (train, val, test)."""

from __future__ import annotations

import lightning.pytorch as pl
from torch.utils.data import DataLoader, Dataset


class SplitDataModule(pl.LightningDataModule):
    """Serves ``self.splits["train" | "val" | "test"]`` with ``hparams.batch_size`` and
    ``hparams.num_workers``; training batches are shuffled."""

    splits: dict[str, Dataset]

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        return DataLoader(self.splits[split], batch_size=self.hparams.batch_size, shuffle=shuffle,
                          num_workers=self.hparams.num_workers)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", shuffle=False)
