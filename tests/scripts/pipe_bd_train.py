"""Runs several Pipe-BD configurations on the toy task in one torchrun job (one after another, in
the same processes); rank 0 saves each run's student, metrics and report to OUT/<name>.pt.

    torchrun --nproc-per-node=4 tests/scripts/pipe_bd_train.py OUT name:mode:schedule:widths:dpu ...

``schedule`` is ``auto``, ``even`` or blocks like ``0,1/2,3``; ``widths`` like ``3,1`` or ``-``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

import lightning.pytorch as pl  # noqa: E402

from distill_toy import ToyData, ToyDistillation  # noqa: E402
from lightning_granndis.strategies import PipeBDStrategy  # noqa: E402

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)


def fit(name: str, spec: str, callbacks=(), ckpt_path=None, lightning_sampler: bool = False) -> None:
    mode, schedule, widths, dpu = spec.split(":")
    if schedule not in ("auto", "even"):
        schedule = [[int(b) for b in s.split(",")] for s in schedule.split("/")]
    strategy = PipeBDStrategy(mode=mode, schedule=schedule, dp_widths=None if widths == "-" else
                              [int(w) for w in widths.split(",")], dpu=dpu == "1", profile_repeats=1)
    model = ToyDistillation()
    trainer = pl.Trainer(accelerator="cpu", devices=4, strategy=strategy, max_epochs=2, logger=False,
                         enable_checkpointing=bool(callbacks), callbacks=list(callbacks), enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0,
                         use_distributed_sampler=lightning_sampler)  # False: the DataLoader's own order
    trainer.fit(model, datamodule=ToyData(), ckpt_path=ckpt_path)
    if trainer.is_global_zero:
        torch.save({"student": model.assemble_student().state_dict(),
                    "metrics": {k: float(v) for k, v in trainer.callback_metrics.items()},
                    "report": strategy.report, "schedule": strategy.schedule.to_dict()}, out / f"{name}.pt")


for arg in sys.argv[2:]:
    name, spec = arg.split(":", 1)
    if name == "lightning_sampler":
        # Lightning's default: its shuffling DistributedSampler, seeded by PL_GLOBAL_SEED
        pl.seed_everything(5, verbose=False)
        fit(name, spec, lightning_sampler=True)
        import os

        os.environ.pop("PL_GLOBAL_SEED")
        continue
    if name != "resume":
        fit(name, spec)
        continue
    # checkpoint every epoch, then resume from the first epoch's: same schedule, then another one
    from lightning.pytorch.callbacks import ModelCheckpoint

    fit("ckpt_full", spec, [ModelCheckpoint(dirpath=out / "ckpt", save_top_k=-1, every_n_epochs=1)])
    first = out / "ckpt" / "epoch=0-step=4.ckpt"
    fit("ckpt_resumed", spec, ckpt_path=first)
    try:
        fit("ckpt_other", "tr:even:-:1", ckpt_path=first)
        message = ""
    except ValueError as err:
        message = str(err)
    if pl.utilities.rank_zero.rank_zero_only.rank == 0:
        (out / "ckpt_other.txt").write_text(message)

# Leave the process group cleanly: a rank torn down at interpreter exit can abort (seen on busy CI).
from lightning_granndis import comm as _comm  # noqa: E402

_comm.barrier()
_comm.destroy()
