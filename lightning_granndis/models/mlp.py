"""A multi-layer perceptron classifier: the smallest reference LightningModule."""

from __future__ import annotations

from collections.abc import Sequence

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics.classification import MulticlassAccuracy


class MLPClassifier(pl.LightningModule):
    """``Linear → ReLU → Dropout`` blocks and a linear head, trained with cross-entropy and Adam.

    Args:
        in_features: input width (default 64, the digits images).
        num_classes: number of classes (default 10).
        hidden: widths of the hidden layers (default ``[256, 256]``).
        dropout: dropout after every hidden layer (default 0.1).
        lr: Adam's learning rate (default 1e-3).

    Shapes: ``x`` ``[B, in_features]`` → logits ``[B, num_classes]``.
    """

    def __init__(
        self,
        in_features: int = 64,
        num_classes: int = 10,
        hidden: Sequence[int] = (256, 256),
        dropout: float = 0.1,
        lr: float = 1e-3,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        layers: list[nn.Module] = []
        width = in_features
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU(), nn.Dropout(dropout)]
            width = h
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)
        self.val_acc = MulticlassAccuracy(num_classes, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes, average="micro")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.val_acc(logits, y)
        self.log("val_loss", F.cross_entropy(logits, y), sync_dist=True)
        self.log("val_acc", self.val_acc, prog_bar=True)

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.test_acc(self(x), y)
        self.log("test_acc", self.test_acc)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
