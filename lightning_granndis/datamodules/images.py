"""Small-image classification data for teachers and blockwise distillation: CIFAR-10 from its
official files, and scikit-learn's digits as the offline default."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, TensorDataset

from lightning_granndis.datamodules.splits import SplitDataModule

DATASETS = ("digits", "cifar10")
CIFAR_DIR = "cifar-10-batches-py"
CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


def read_cifar10(root: str | Path, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Images ``[N, 3, 32, 32]`` (uint8) and labels ``[N]`` from the official python version of
    CIFAR-10 under ``root/cifar-10-batches-py`` (``data_batch_1..5`` or ``test_batch``)."""
    folder = Path(root) / CIFAR_DIR
    names = [f"data_batch_{i}" for i in range(1, 6)] if train else ["test_batch"]
    xs, ys = [], []
    for name in names:
        path = folder / name
        if not path.exists():
            raise FileNotFoundError(
                f"CIFAR-10 file {path} is missing: pass download=True on a machine that can reach the internet "
                f"(torchvision fetches it into {root}), or copy the official cifar-10-python archive's "
                f"{CIFAR_DIR}/ there."
            )
        try:
            with open(path, "rb") as f:
                entry = pickle.load(f, encoding="latin1")
            data = np.asarray(entry["data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
            labels = np.asarray(entry["labels"], dtype=np.int64)
        except (pickle.UnpicklingError, KeyError, ValueError, EOFError) as err:
            raise ValueError(f"{path} is not a CIFAR-10 python batch ({err}): re-download or re-extract it.") from err
        if len(labels) != len(data) or (len(labels) and (labels.min() < 0 or labels.max() > 9)):
            raise ValueError(f"{path}: {len(data)} images but {len(labels)} labels in 0..9; the file is corrupt.")
        xs.append(torch.from_numpy(data.copy()))
        ys.append(torch.from_numpy(labels.copy()))
    return torch.cat(xs), torch.cat(ys)


class _Augmented(Dataset):
    """Random crop (4-pixel padding) and horizontal flip, per sample, on normalised tensors."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, flip: bool) -> None:
        self.x, self.y, self.flip = x, y, flip

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        x = F.pad(self.x[i], (4, 4, 4, 4))
        dx, dy = torch.randint(0, 9, (2,)).tolist()
        x = x[:, dy:dy + self.x.shape[2], dx:dx + self.x.shape[3]]
        if self.flip and torch.rand(()) < 0.5:
            x = x.flip(-1)
        return x, self.y[i]


class ImageDataModule(SplitDataModule):
    """Small images for classification and distillation.

    Args:
        dataset: ``"digits"`` (default: scikit-learn's 1,797 handwritten digits, shipped offline,
            upsampled to ``image_size``, one channel) or ``"cifar10"`` (``root``'s official files).
        root: where CIFAR-10 lives or is downloaded to (default ``data``).
        download: let torchvision download CIFAR-10 into ``root`` (default ``False``).
        image_size: digits are resized to this side (default 16); CIFAR-10 is 32.
        batch_size: samples per batch (default 64).
        val_fraction: share of the training set held out for validation (default 0.1 for CIFAR-10;
            digits split 70/15/15 into train/val/test).
        augment: random crops (and flips for CIFAR-10) in training (default ``False``).
        seed: seed of the splits (default 0).
        num_workers: DataLoader workers (default 0).

    Batches are ``(x, y)``: ``x`` of shape ``[B, C, H, W]`` normalised per channel, ``y`` ``[B]``.
    """

    def __init__(self, dataset: str = "digits", root: str = "data", download: bool = False, image_size: int = 16,
                 batch_size: int = 64, val_fraction: float = 0.1, augment: bool = False, seed: int = 0,
                 num_workers: int = 0) -> None:
        super().__init__()
        if dataset not in DATASETS:
            raise ValueError(f"unknown dataset {dataset!r}; choose one of {', '.join(DATASETS)}.")
        if dataset == "cifar10" and image_size != 32:
            raise ValueError("CIFAR-10 images are 32x32: set image_size: 32.")
        self.save_hyperparameters()
        self.splits: dict[str, Dataset] = {}

    @property
    def in_channels(self) -> int:
        return 1 if self.hparams.dataset == "digits" else 3

    def prepare_data(self) -> None:
        if self.hparams.dataset == "cifar10" and self.hparams.download:
            import torchvision

            torchvision.datasets.CIFAR10(self.hparams.root, train=True, download=True)
            torchvision.datasets.CIFAR10(self.hparams.root, train=False, download=True)

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        hp = self.hparams
        gen = torch.Generator().manual_seed(hp.seed)
        if hp.dataset == "digits":
            from sklearn.datasets import load_digits

            digits = load_digits()
            x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
            x = F.interpolate(x, size=(hp.image_size, hp.image_size), mode="bilinear", align_corners=False)
            y = torch.tensor(digits.target, dtype=torch.long)
            x = (x - x.mean()) / x.std()
            order = torch.randperm(len(y), generator=gen)
            n_val = n_test = int(0.15 * len(y))
            parts = {"val": order[:n_val], "test": order[n_val:n_val + n_test], "train": order[n_val + n_test:]}
            data = {k: (x[idx], y[idx]) for k, idx in parts.items()}
        else:
            x, y = read_cifar10(hp.root, train=True)
            x_test, y_test = read_cifar10(hp.root, train=False)
            mean = torch.tensor(CIFAR_MEAN).view(1, 3, 1, 1)
            std = torch.tensor(CIFAR_STD).view(1, 3, 1, 1)
            x = (x.float() / 255 - mean) / std
            x_test = (x_test.float() / 255 - mean) / std
            order = torch.randperm(len(y), generator=gen)
            n_val = int(hp.val_fraction * len(y))
            data = {"val": (x[order[:n_val]], y[order[:n_val]]), "train": (x[order[n_val:]], y[order[n_val:]]),
                    "test": (x_test, y_test)}
        self.splits = {k: TensorDataset(*v) for k, v in data.items()}
        if hp.augment:
            self.splits["train"] = _Augmented(*data["train"], flip=hp.dataset == "cifar10")
