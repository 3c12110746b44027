"""Under torchrun (4 ranks): the same MLP trained with Lightning's DDP, with server_aware_ddp
(hierarchical, 2 virtual servers) and with server_aware_ddp flat. Saves parameters and ledgers."""

import json
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.strategies import DDPStrategy

import lightning_granndis  # noqa: F401
from lightning_granndis.callbacks import CommMonitor
from lightning_granndis.datamodules import DigitsDataModule
from lightning_granndis.models import MLPClassifier
from lightning_granndis.strategies import ServerAwareDDPStrategy

out = Path(sys.argv[1])
steps = int(sys.argv[2])
configs = {
    "ddp": lambda: DDPStrategy(),
    "hier": lambda: ServerAwareDDPStrategy(servers=2, link_model="10gbe"),
    "flat": lambda: ServerAwareDDPStrategy(servers=2, link_model="10gbe", hierarchical=False),
}
for name, make in configs.items():
    pl.seed_everything(0)
    model = MLPClassifier(hidden=[64, 64], dropout=0.0, lr=0.01)
    strategy = make()
    monitor = CommMonitor(dirpath=str(out / name), log_every_n_steps=2)
    trainer = pl.Trainer(
        accelerator="cpu", devices=4, strategy=strategy, max_steps=steps, logger=CSVLogger(out, name=name),
        callbacks=[monitor], enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, limit_val_batches=2, val_check_interval=steps,
    )
    trainer.fit(model, datamodule=DigitsDataModule(batch_size=16))
    rank = trainer.global_rank
    (out / name).mkdir(parents=True, exist_ok=True)
    if rank == 0:
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, out / name / "params.pt")
    record = {"params": sum(p.numel() for p in model.parameters()), "steps": trainer.global_step}
    comm_obj = getattr(strategy, "comm", None)
    if comm_obj is not None:
        record["ledger"] = comm_obj.ledger.to_dict()
        record["servers"] = strategy.topology.servers
        record["log_dir"] = trainer.log_dir
        record["summary_png"] = (monitor.summary or {}).get("png")
    (out / name / f"rank{rank}.json").write_text(json.dumps(record))

# Leave the process group cleanly: a rank torn down at interpreter exit can abort (seen on busy CI).
from lightning_granndis import comm as _comm  # noqa: E402

_comm.barrier()
_comm.destroy()
