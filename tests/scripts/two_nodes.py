"""Launched by two torchrun processes (--nnodes=2, node ranks 0 and 1, 2 processes each).

Checks that the topology comes out as 2 servers without being told, both from the environment
and inside a Lightning run of server_aware_ddp with num_nodes=2.
"""

import json
import os
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch

import lightning_granndis  # noqa: F401
from lightning_granndis import comm
from lightning_granndis.datamodules import DigitsDataModule
from lightning_granndis.models import MLPClassifier
from lightning_granndis.topology import ServerTopology

out = Path(sys.argv[1])
env_topology = ServerTopology.from_env()
trainer = pl.Trainer(
    accelerator="cpu", devices=2, num_nodes=2, strategy="server_aware_ddp", max_steps=2, logger=False,
    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
    limit_val_batches=0,
)
trainer.fit(MLPClassifier(hidden=[16]), datamodule=DigitsDataModule(batch_size=8))
strategy = trainer.strategy
topo = strategy.topology
rank = trainer.global_rank
groups = comm.server_groups(topo)
probe = torch.tensor([float(rank)])
strategy.comm.all_reduce(probe, "other", group=groups.intra_of(topo, rank))
record = {
    "rank": rank,
    "node_rank": int(os.environ["GROUP_RANK"]),
    "env_servers": env_topology.servers,
    "servers": topo.servers,
    "server": topo.server_of(rank),
    "slot": topo.slot_of(rank),
    "is_head": topo.is_head(rank),
    "intra_sum": probe.item(),
    "inter_grad_bytes": strategy.comm.ledger.get("inter", "grad_sync").bytes,
}
(out / f"rank{rank}.json").write_text(json.dumps(record))

# Leave the process group cleanly: a rank torn down at interpreter exit can abort (seen on busy CI).
comm.barrier()
comm.destroy()
