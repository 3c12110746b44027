"""A user's own pipelined classifier under Optimus-CC's compression (2 stages x 2 replicas): validation
accuracy from ``self(x)``, a training accuracy from ``pipeline_step(return_outputs=True)`` (a
torchmetrics metric), ``ModelCheckpoint`` and ``EarlyStopping`` monitoring it, then
``trainer.predict``. Rank r writes OUT/rank{r}.json.

    torchrun --nproc-per-node=4 tests/scripts/pipeline_outputs.py OUT [log_in_loss]
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
import torchmetrics
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning_granndis  # noqa: F401
from lightning_granndis.pipeline import PipelinedModule
from lightning_granndis.strategies import CompressedPipelineStrategy

torch.set_num_threads(1)
out = Path(sys.argv[1])
log_in_loss = len(sys.argv) > 2 and sys.argv[2] == "log_in_loss"
g = torch.Generator().manual_seed(0)
X, Y = torch.randn(64, 6, generator=g), torch.randint(0, 3, (64,), generator=g)


class Classifier(PipelinedModule):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Linear(16, 3))
        self.train_acc = torchmetrics.Accuracy(task="multiclass", num_classes=3)

    def pipeline_loss(self, output, batch):
        if log_in_loss:
            self.log("loss_inside", output.mean())
        return nn.functional.cross_entropy(output, batch[1])

    def training_step(self, batch, batch_idx):
        loss, outputs = self.pipeline_step(batch, return_outputs=True)
        self.train_acc(outputs, batch[1])
        self.log("train_acc", self.train_acc, on_step=False, on_epoch=True)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        acc = (self(x).argmax(-1) == y).float().mean()
        self.log("val_acc", acc, prog_bar=True, sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)


pl.seed_everything(0)
model = Classifier()
checkpoint = ModelCheckpoint(dirpath=out / "ckpt", monitor="val_acc", mode="max", save_top_k=1)
strategy = CompressedPipelineStrategy(stages=2, compress_backward=True, rank=2, fused_embedding=True, dp_compression=True)
trainer = pl.Trainer(accelerator="cpu", devices=4, strategy=strategy, max_epochs=3, logger=False,
                     callbacks=[checkpoint, EarlyStopping(monitor="val_acc", mode="max", patience=5)],
                     enable_progress_bar=False, enable_model_summary=False)
data = DataLoader(TensorDataset(X, Y), batch_size=8)
trainer.fit(model, data, data)
metrics = {k: float(trainer.callback_metrics[k]) for k in ("val_acc", "train_acc")}
trainer.save_checkpoint(out / "final.ckpt")
predictions = trainer.predict(model, DataLoader(TensorDataset(X[:16], Y[:16]), batch_size=4))
rank = int(os.environ["RANK"])
(out / f"rank{rank}.json").write_text(json.dumps({
    **metrics, "best": str(checkpoint.best_model_path), "best_score": float(checkpoint.best_model_score),
    "replica": trainer.strategy.layout.replica, "predictions": torch.cat(predictions).tolist(),
}))
from lightning_granndis import comm  # noqa: E402

comm.barrier()
comm.destroy()
