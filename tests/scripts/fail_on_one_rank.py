"""One rank fails; the test reads what every rank printed (torchrun --tee).

    torchrun --nproc-per-node=4 tests/scripts/fail_on_one_rank.py OUT pipeline|ddp
"""

from __future__ import annotations

import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

import lightning_granndis  # noqa: F401
from lightning_granndis.pipeline import PipelinedModule

torch.set_num_threads(1)
out, case = Path(sys.argv[1]), sys.argv[2]


class ReturnsATuple(nn.Linear):
    def forward(self, x):
        return super().forward(x), x  # a pipeline block must return one tensor


class UserPipeline(PipelinedModule):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8), ReturnsATuple(8, 8), nn.Linear(8, 8))

    def pipeline_loss(self, output, batch):
        return nn.functional.mse_loss(output, batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class BadRow(Dataset):
    """Row 5 cannot be read (a data error): Lightning's sampler gives it to one rank."""

    def __len__(self):
        return 32

    def __getitem__(self, i):
        if i == 5:
            raise ValueError(f"row {i} is corrupt")
        return torch.randn(8), torch.randn(8)


class UserModel(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(8, 8)

    def training_step(self, batch, batch_idx):
        return nn.functional.mse_loss(self.net(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


torch.manual_seed(0)
if case == "pipeline":
    model, strategy = UserPipeline(), "compressed_pipeline"
    data = DataLoader(TensorDataset(torch.randn(32, 8), torch.randn(32, 8)), batch_size=8)
else:
    model, strategy = UserModel(), "server_aware_ddp"
    data = DataLoader(BadRow(), batch_size=2, shuffle=False)
trainer = pl.Trainer(accelerator="cpu", devices=4, strategy=strategy, max_steps=4, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(model, data)
