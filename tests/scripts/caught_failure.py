"""A sweep as a user writes one, under torchrun: the first configuration's ``fit`` raises on every
rank (a bad learning rate found at step 2) and is caught; the next ``fit`` and a ``validate`` in the
same processes must run normally. Rank 0 writes OUT/result.json."""

import json
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_granndis.strategies import ServerAwareDDPStrategy

out = Path(sys.argv[1])
torch.set_num_threads(1)


class Diverges(BoringModel):
    def training_step(self, batch, batch_idx):
        if self.global_step == 2:
            raise FloatingPointError("loss is nan: learning rate too high")
        return super().training_step(batch, batch_idx)


def trainer(steps):
    return pl.Trainer(accelerator="cpu", devices=int(sys.argv[2]), strategy=ServerAwareDDPStrategy(servers=2),
                      max_steps=steps, logger=False, enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=False, limit_val_batches=2)


result = {}
try:
    trainer(6).fit(Diverges())
    result["first"] = "finished"
except FloatingPointError as error:
    result["first"] = f"caught: {error}"
second = trainer(6)
second.fit(BoringModel())
result["second_steps"] = second.global_step
result["validate"] = len(second.validate(BoringModel(), verbose=False))
if second.global_rank == 0:
    (out / "result.json").write_text(json.dumps(result))
