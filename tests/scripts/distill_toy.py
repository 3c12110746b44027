"""A tiny blockwise-distillation task shared by the Pipe-BD tests and their worker script."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning.pytorch as pl

from lightning_granndis.distill import BlockwiseDistillation


def teacher_blocks() -> list[nn.Module]:
    return [
        nn.Sequential(nn.Conv2d(1, 6, 3, padding=1), nn.ReLU()),
        nn.Sequential(nn.Conv2d(6, 8, 3, stride=2, padding=1), nn.ReLU()),
        nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.Tanh()),
        nn.Sequential(nn.Flatten(), nn.Linear(8 * 4 * 4, 10)),
    ]


def student_blocks() -> list[nn.Module]:
    return [
        nn.Sequential(nn.Conv2d(1, 6, 1), nn.ReLU()),
        nn.Sequential(nn.Conv2d(6, 8, 1, stride=2), nn.ReLU()),
        nn.Sequential(nn.Conv2d(8, 8, 1)),
        nn.Sequential(nn.Flatten(), nn.Linear(8 * 4 * 4, 10)),
    ]


class ToyDistillation(BlockwiseDistillation):
    def __init__(self, lr: float = 0.01) -> None:
        torch.manual_seed(0)
        super().__init__(teacher_blocks(), student_blocks(), lr=lr)
        self.example_input_array = torch.zeros(1, 1, 8, 8)


class ToyData(pl.LightningDataModule):
    """32 training and 20 validation samples; batches of 10 (the last training batch has 2 rows)."""

    def __init__(self, batch_size: int = 10) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(52, 1, 8, 8, generator=g)
        self.y = torch.randint(0, 10, (52,), generator=g)
        self.batch_size = batch_size

    def train_dataloader(self):
        return DataLoader(TensorDataset(self.x[:32], self.y[:32]), batch_size=self.batch_size, shuffle=False)

    def val_dataloader(self):
        return DataLoader(TensorDataset(self.x[32:], self.y[32:]), batch_size=self.batch_size, shuffle=False)


class ToyDataInLightningsOrder(ToyData):
    """The training order Lightning gives a multi-process run by default (a shuffling
    ``DistributedSampler`` of one replica, seeded by ``seed_everything``), for a one-process run:
    the README's one line."""

    def __init__(self, seed: int, batch_size: int = 10) -> None:
        super().__init__(batch_size)
        self.seed = seed

    def train_dataloader(self):
        from torch.utils.data import DistributedSampler

        data = TensorDataset(self.x[:32], self.y[:32])
        return DataLoader(data, batch_size=self.batch_size,
                          sampler=DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=self.seed))
