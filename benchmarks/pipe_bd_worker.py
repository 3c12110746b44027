"""One torchrun job of benchmarks/pipe_bd.py: distils the same teacher into the same student with
each row's strategy in turn; every rank writes OUT/<row>_rank<r>.json."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback

from lightning_granndis import comm
from lightning_granndis.callbacks import PeakMemory
from lightning_granndis.datamodules import ImageDataModule
from lightning_granndis.models import ImageBlockwiseDistillation
from lightning_granndis.strategies import PipeBDStrategy


class EpochTimer(Callback):
    def __init__(self) -> None:
        self.epochs: list[float] = []

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._t0 = time.perf_counter()

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.epochs.append(time.perf_counter() - self._t0)


def run(row: dict, settings: dict, out: Path) -> None:
    pl.seed_everything(0, verbose=False)
    model = ImageBlockwiseDistillation(teacher_weights=settings["teacher"], width_mult=settings["width_mult"],
                                       image_size=settings["image_size"], in_channels=1, num_blocks=6,
                                       lr=settings["lr"])
    data = ImageDataModule(image_size=settings["image_size"], batch_size=settings["batch"])
    timer, memory = EpochTimer(), PeakMemory()
    t0 = time.perf_counter()
    strategy = PipeBDStrategy(**row["strategy"])
    trainer = pl.Trainer(accelerator="cpu", devices=settings["nproc"], strategy=strategy,
                         max_epochs=settings["epochs"], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         check_val_every_n_epoch=settings["epochs"], callbacks=[timer, memory])
    trainer.fit(model, datamodule=data)
    wall = time.perf_counter() - t0
    record = {"epochs_s": timer.epochs, "wall_s": wall, **memory.measure(trainer), "report": strategy.report,
              "val_student_acc": float(trainer.callback_metrics.get("val_student_acc", float("nan"))),
              "ahd": strategy.ahd.describe() if strategy.ahd is not None else None}
    if trainer.is_global_zero:  # the point of distilling: the assembled student on the test split
        data.setup()
        student = model.assemble_student()
        correct = total = 0
        with torch.no_grad():
            for x, y in data.test_dataloader():
                correct += int((student(x).argmax(-1) == y).sum())
                total += len(y)
        record["student_acc"] = correct / total
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{row['name']}_rank{trainer.global_rank}.json").write_text(json.dumps(record))
    comm.barrier()


if __name__ == "__main__":
    out, settings, rows = Path(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
    for row in rows:
        run(row, settings, out)
    comm.barrier()
    comm.destroy()
