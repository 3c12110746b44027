"""scikit-learn's handwritten digits: a small real classification task that ships offline."""

from __future__ import annotations

import torch
from torch.utils.data import TensorDataset

from lightning_granndis.datamodules.splits import SplitDataModule


class DigitsDataModule(SplitDataModule):
    """The 1,797 8×8 digit images bundled with scikit-learn, split deterministically.

    Args:
        batch_size: samples per batch and per rank (default 64).
        val_fraction: share of samples held out for validation (default 0.15).
        test_fraction: share held out for testing (default 0.15).
        seed: seed of the split (default 0).
        num_workers: DataLoader workers (default 0).

    Batches are ``(x, y)`` with ``x`` of shape ``[B, 64]`` (pixels scaled to [0, 1]) and ``y`` of
    shape ``[B]`` (classes 0–9).
    """

    num_features = 64
    num_classes = 10

    def __init__(
        self,
        batch_size: int = 64,
        val_fraction: float = 0.15,
        test_fraction: float = 0.15,
        seed: int = 0,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        if not 0 < val_fraction + test_fraction < 1:
            raise ValueError(
                f"val_fraction + test_fraction must lie in (0, 1), got {val_fraction} + {test_fraction}."
            )
        self.save_hyperparameters()
        self.splits: dict[str, TensorDataset] = {}

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        from sklearn.datasets import load_digits

        digits = load_digits()
        x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
        y = torch.tensor(digits.target, dtype=torch.long)
        order = torch.randperm(len(y), generator=torch.Generator().manual_seed(self.hparams.seed))
        n_val = int(len(y) * self.hparams.val_fraction)
        n_test = int(len(y) * self.hparams.test_fraction)
        parts = {"val": order[:n_val], "test": order[n_val : n_val + n_test], "train": order[n_val + n_test :]}
        self.splits = {k: TensorDataset(x[idx], y[idx]) for k, idx in parts.items()}
