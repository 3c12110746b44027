"""Every rank warns the same thing, and one thing of its own: under torchrun (``torchrun``) or
Lightning's own launcher (``lightning``, three CPU processes)."""

import os
import sys
import warnings

import lightning_granndis  # noqa: F401  (shows each warning once per launch)


def warn(rank: int) -> None:
    warnings.warn("a warning every rank raises", UserWarning)
    warnings.warn(f"a warning of rank {rank} alone", UserWarning)


if sys.argv[1] == "torchrun":
    warn(int(os.environ["RANK"]))
else:
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.demos.boring_classes import BoringModel

    class Warns(BoringModel):
        def on_train_start(self) -> None:
            warn(self.global_rank)

    torch.set_num_threads(1)
    trainer = pl.Trainer(accelerator="cpu", devices=3, strategy="ddp", max_steps=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Warns())
