"""Under torchrun: the rows of benchmarks/pipeline.py, one after another in the same processes.

usage: pipeline_worker.py OUT SETTINGS_JSON ROWS_JSON
Each row is {"name", "kind": "lightning" | "torch_pipelining", "strategy": {...}, "link": {...}|null,
"emulate": bool}. Writes OUT/<name>_rank<r>.json: step_s (mean after warm-up), val_loss, bytes per
link/purpose (ours), link description and scale.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import lightning.pytorch as pl
import torch
import torch.nn.functional as F

import lightning_granndis  # noqa: F401
from lightning_granndis import comm
from lightning_granndis.datamodules import TextDataModule
from lightning_granndis.ledger import PURPOSES
from lightning_granndis.models import GPT
from lightning_granndis.strategies import CompressedPipelineStrategy

out, settings, rows = Path(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.set_num_threads(1)
WARMUP = settings["warmup"]


class StepTimer(pl.Callback):
    def __init__(self):
        self.times, self._t0 = [], 0.0

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.times.append(time.perf_counter() - self._t0)


def datamodule(batch_size: int) -> TextDataModule:
    return TextDataModule(block_size=settings["block"], batch_size=batch_size, max_files=settings["files"])


def model() -> GPT:
    pl.seed_everything(0)
    return GPT(vocab_size=256, block_size=settings["block"], hidden=settings["hidden"], layers=settings["layers"],
               heads=settings["heads"], lr=settings["lr"], lr_schedule="constant")


def lightning_row(row: dict) -> dict:
    strategy = CompressedPipelineStrategy(stages=settings["stages"], schedule=row.get("schedule", "1f1b"),
                                          microbatches=settings["micro"], link_model=row["link"],
                                          emulate=row["emulate"], servers=row.get("servers", 1),
                                          **row.get("strategy", {}))
    timer = StepTimer()
    trainer = pl.Trainer(accelerator="cpu", devices=world, strategy=strategy, max_steps=settings["steps"],
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[timer], limit_val_batches=settings["val_batches"],
                         num_sanity_val_steps=0, val_check_interval=None, check_val_every_n_epoch=None,
                         gradient_clip_val=1.0)
    gpt, dm = model(), datamodule(settings["batch"])
    trainer.fit(gpt, datamodule=dm)
    ledger = trainer.strategy.comm.ledger
    record = {
        "step_s": sum(timer.times[WARMUP:]) / max(1, len(timer.times[WARMUP:])),
        "bytes": {f"{lk}/{p}": ledger.get(lk, p).bytes for lk in ("intra", "inter") for p in PURPOSES},
        "link": trainer.strategy.link_model.describe(), "scale": trainer.strategy.link_model.scale,
        "stage": trainer.strategy.layout.stage, "replica": trainer.strategy.layout.replica,
        "balance": list(trainer.strategy.layout.plan.balance),
    }
    record["val_loss"] = trainer.validate(gpt, datamodule=dm, verbose=False)[0]["val_loss"]
    return record


def torch_pipelining_row(row: dict) -> dict:
    """The same GPT, blocks and balance under torch.distributed.pipelining (ScheduleGPipe or
    Schedule1F1B). It cannot tie weights across stages, so the head gets its own copy."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    from torch.utils.data import DataLoader

    if not comm.is_initialized():
        comm.init_from_env()
    gpt = model()
    blocks = list(gpt.blocks)
    head = blocks[-1]
    head.weight = torch.nn.Parameter(head.weight.detach().clone())  # untied
    balance = row["balance"]
    start = sum(balance[:rank])
    stage_module = torch.nn.Sequential(*blocks[start:start + balance[rank]])
    stage = PipelineStage(stage_module, rank, world, torch.device("cpu"))
    loss_fn = lambda logits, y: F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))  # noqa: E731
    cls = ScheduleGPipe if row["schedule"] == "gpipe" else Schedule1F1B
    schedule = cls(stage, n_microbatches=settings["micro"], loss_fn=loss_fn)
    optimizer = torch.optim.AdamW(stage_module.parameters(), lr=settings["lr"], betas=(0.9, 0.95))
    dm = datamodule(settings["batch"])
    dm.setup("fit")
    loader = DataLoader(dm.train_dataloader().dataset, batch_size=settings["batch"], shuffle=True,
                        generator=torch.Generator().manual_seed(0), drop_last=True)
    times = []
    for i, (x, y) in enumerate(loader):
        if i == settings["steps"]:
            break
        t0 = time.perf_counter()
        optimizer.zero_grad()
        losses: list = []
        if rank == 0:
            schedule.step(x)
        elif rank == world - 1:
            schedule.step(target=y, losses=losses)
        else:
            schedule.step()
        torch.nn.utils.clip_grad_norm_(stage_module.parameters(), 1.0)  # per stage: close enough for timing
        optimizer.step()
        times.append(time.perf_counter() - t0)
    return {"step_s": sum(times[WARMUP:]) / max(1, len(times[WARMUP:])), "bytes": {}, "val_loss": None,
            "stage": rank, "replica": 0}


for row in rows:
    record = lightning_row(row) if row["kind"] == "lightning" else torch_pipelining_row(row)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{row['name']}_rank{rank}.json").write_text(json.dumps(record))
    comm.barrier()

# Leave the process group cleanly: a rank torn down at interpreter exit can abort (seen on busy CI).
from lightning_granndis import comm as _comm  # noqa: E402

_comm.barrier()
_comm.destroy()
