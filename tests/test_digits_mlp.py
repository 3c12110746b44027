"""The offline digits task and the MLP reference model, in one process."""

import lightning.pytorch as pl
import pytest
import torch

from lightning_granndis.datamodules import DigitsDataModule
from lightning_granndis.models import MLPClassifier


def test_digits_split_is_deterministic_and_disjoint():
    a, b = DigitsDataModule(seed=3), DigitsDataModule(seed=3)
    a.setup(), b.setup()
    sizes = {k: len(v) for k, v in a.splits.items()}
    assert sum(sizes.values()) == 1797 and sizes["val"] == sizes["test"] == 269
    assert torch.equal(a.splits["train"].tensors[0], b.splits["train"].tensors[0])
    x, y = next(iter(a.train_dataloader()))
    assert x.shape == (64, 64) and x.max() <= 1.0 and y.dtype == torch.long
    with pytest.raises(ValueError, match="val_fraction"):
        DigitsDataModule(val_fraction=0.6, test_fraction=0.5)


def test_mlp_learns_digits_well_above_chance():
    pl.seed_everything(0)
    model, data = MLPClassifier(), DigitsDataModule()
    trainer = pl.Trainer(accelerator="cpu", max_epochs=3, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, datamodule=data)
    acc = trainer.test(model, datamodule=data, verbose=False)[0]["test_acc"]
    assert acc > 0.85  # chance is 0.10
