"""Under torchrun: FLX training from a graph store that is bad for some ranks only; every rank
writes the error it raised (or "trained") to OUT/rank<r>.txt.

usage: gnn_store_refusal.py OUT STORE HOPS
"""

import os
import sys
from pathlib import Path

import lightning.pytorch as pl

import lightning_granndis  # noqa: F401
from lightning_granndis.datamodules.graph_store import GraphStoreDataModule
from lightning_granndis.models.gnn import GNNNodeClassifier
from lightning_granndis.strategies import ServerAwareGNNStrategy

out, store, hops = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
dm = GraphStoreDataModule(store)
dm.setup()
model = GNNNodeClassifier(dm.num_features, dm.num_classes, conv="sage", hidden=8, num_layers=hops)
trainer = pl.Trainer(accelerator="cpu", devices=int(os.environ["LOCAL_WORLD_SIZE"]),
                     strategy=ServerAwareGNNStrategy(mode="flx", servers=2), max_steps=1, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                     num_sanity_val_steps=0)
try:
    trainer.fit(model, datamodule=dm)
    message = "trained"
except Exception as error:  # what each rank reports
    message = f"{type(error).__name__}: {error}"
(out / f"rank{os.environ['RANK']}.txt").write_text(message)
# every rank raised at the same collective: leave together, so no rank tears the group down under another
import torch.distributed as dist  # noqa: E402

if dist.is_initialized():
    dist.barrier()
    dist.destroy_process_group()
