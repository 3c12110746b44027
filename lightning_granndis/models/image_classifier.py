"""A small-image classifier on a torchvision backbone: the teacher that blockwise distillation needs
(no pretrained weights can be downloaded here, so the recipe trains it first)."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import torch
import torch.nn.functional as F

from lightning_granndis.models.small_vision import small_image_net


class ImageClassifier(pl.LightningModule):
    """Cross-entropy training of :func:`~lightning_granndis.models.small_vision.small_image_net`.

    Args:
        arch: ``"mobilenet_v2"`` (default) or ``"resnet18"``.
        num_classes: classes (default 10).
        in_channels: image channels (default 1: the embedded digits; 3 for CIFAR-10).
        image_size: side of the square images (default 16), for ``example_input_array``.
        width_mult: MobileNetV2's width multiplier (default 1.0).
        lr: AdamW learning rate (default 1e-2), cosine-annealed over ``max_epochs``.
        weight_decay: AdamW weight decay (default 5e-4).
        export_path: when set, the network's ``state_dict`` is written there (atomically) at the
            end of ``fit``: the teacher weights the distillation recipes load.

    Logs ``train_loss``, ``val_loss``, ``val_acc``, ``test_acc``.
    """

    def __init__(self, arch: str = "mobilenet_v2", num_classes: int = 10, in_channels: int = 1, image_size: int = 16,
                 width_mult: float = 1.0, lr: float = 1e-2, weight_decay: float = 5e-4,
                 export_path: str | None = None) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = small_image_net(arch, num_classes, in_channels, width_mult)
        self.example_input_array = torch.zeros(1, in_channels, image_size, image_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def _eval(self, batch, prefix: str) -> None:
        x, y = batch
        logits = self(x)
        self.log(f"{prefix}_loss", F.cross_entropy(logits, y), sync_dist=True)
        self.log(f"{prefix}_acc", (logits.argmax(-1) == y).float().mean(), prog_bar=True, sync_dist=True)

    def validation_step(self, batch, batch_idx):
        self._eval(batch, "val")

    def test_step(self, batch, batch_idx):
        self._eval(batch, "test")

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)
        epochs = max(1, self.trainer.max_epochs or 1)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.CosineAnnealingLR(opt, epochs)}

    def on_fit_end(self) -> None:
        if self.hparams.export_path and self.trainer.is_global_zero:
            from lightning_granndis.strategies.checkpoint_io import SafeCheckpointIO

            state = {k: v.detach().cpu() for k, v in self.net.state_dict().items()}
            SafeCheckpointIO().save_checkpoint(state, Path(self.hparams.export_path))
            print(f"teacher weights written to {self.hparams.export_path}", flush=True)
