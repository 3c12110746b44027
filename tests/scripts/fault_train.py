"""A small run of one strategy family under torchrun, checkpointing with ResumableCheckpoint and
resuming with ``ckpt_path="last"``; on its first attempt one rank can be SIGKILLed at a step.

usage: fault_train.py FAMILY OUT KILL_STEP KILL_RANK [SLOW_SAVE_S [HOW]]
FAMILY: ddp | gnn | pipeline | pipe_bd. KILL_STEP -1: no fault. SLOW_SAVE_S: seconds each
checkpoint file write takes; the kill then lands inside the KILL_STEP set's write, once this
rank's file is written and before the set is committed. stop: SIGSTOP instead of SIGKILL (ddp's
collective timeout is then 8 s). replica, replica_lost, replica_none: see `how` below.
Writes OUT/final.pt (rank 0: the parameters; pipeline: every rank its stage's) and
OUT/attempts/<restart>.<rank> (one file per start, for the restart count).
"""

import os
import signal
import sys
import time
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader, TensorDataset

import lightning_granndis  # noqa: F401
from lightning_granndis.callbacks import ReplicaSnapshot, ResumableCheckpoint

family, out, kill_step, kill_rank = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
slow_save = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0
# kill: SIGKILL; stop: SIGSTOP (a hung rank); replica*: SIGKILL with a ReplicaSnapshot every step
# (replica_lost: the killed rank's server loses its snapshots too; replica_none: every server does)
how = sys.argv[6] if len(sys.argv) > 6 else "kill"
rank = int(os.environ["RANK"])
restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
torch.set_num_threads(1)
(out / "attempts").mkdir(parents=True, exist_ok=True)
(out / "attempts" / f"{restart}.{rank}").touch()
EVERY, STEPS = (4 if how.startswith("replica") else 2), 8
SNAPSHOTS = out / "shm"  # each server's "node-local memory"


class Kill(Callback):
    """SIGKILLs rank ``kill_rank`` once ``kill_step`` steps are done, on the first attempt only
    (with SLOW_SAVE_S, inside that step's checkpoint write instead)."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if restart == 0 and rank == kill_rank and trainer.global_step == kill_step and not slow_save:
            if how in ("replica_lost", "replica_none"):  # the machine's memory goes with it
                import shutil

                servers = ["server1" if rank >= 2 else "server0"] if how == "replica_lost" else ["server0", "server1"]
                for server in servers:
                    shutil.rmtree(SNAPSHOTS / server, ignore_errors=True)
            os.kill(os.getpid(), signal.SIGSTOP if how == "stop" else signal.SIGKILL)


def tensors(n=64, features=8, classes=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    return TensorDataset(x, (x[:, 0] > 0).long() + (x[:, 1] > 0).long())


class Classifier(pl.LightningModule):
    """A user's own module: an MLP with dropout (so the generator state matters on resume)."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.2),
                                       torch.nn.Linear(16, 3))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self(x), y)

    def train_dataloader(self):
        # 16 rows per rank per epoch, batches of 4: an epoch is 4 steps, a checkpoint every 2;
        # shuffled (Lightning's DistributedSampler then shuffles by epoch)
        return DataLoader(tensors(), batch_size=4, shuffle=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def build():
    """(module, strategy, datamodule or None, devices)."""
    if family == "ddp":
        from lightning_granndis.strategies import ServerAwareDDPStrategy
        from datetime import timedelta

        # a stopped rank makes its peers' collectives time out after 8 s
        timeout = {"timeout": timedelta(seconds=8)} if how == "stop" else {}
        return Classifier(), ServerAwareDDPStrategy(servers=2, link_model="10gbe", **timeout), None
    if family == "gnn":
        from lightning_granndis.datamodules import OGBNodeDataModule
        from lightning_granndis.models import GNNNodeClassifier
        from lightning_granndis.strategies import ServerAwareGNNStrategy
        dm = OGBNodeDataModule("synthetic-tiny", root=str(out.parent / "data"))
        # Cooperative Batching, 4 co-batches an epoch drawn afresh each epoch (its sampler resumes too)
        return (GNNNodeClassifier(32, 8, hidden=16, num_layers=2),
                ServerAwareGNNStrategy(servers=2, mode="cob", iterations=4, link_model="10gbe"), dm)
    if family == "pipeline":
        from lightning_granndis.models import GPT
        from lightning_granndis.strategies import CompressedPipelineStrategy

        class Tokens(pl.LightningDataModule):
            def train_dataloader(self):
                g = torch.Generator().manual_seed(1)
                ids = torch.randint(0, 64, (64, 17), generator=g)
                return DataLoader(TensorDataset(ids[:, :-1], ids[:, 1:]), batch_size=8)

        model = GPT(vocab_size=64, block_size=16, hidden=32, layers=2, heads=2, dropout=0.1, lr_schedule="constant")
        # 2 stages x 2 replicas; compressed backward with error feedback (its residuals resume too)
        return model, CompressedPipelineStrategy(stages=2, microbatches=2, servers=2, link_model="10gbe",
                                                 compress_backward=True, rank=4), Tokens()
    if family == "pipe_bd":
        sys.path.insert(0, str(Path(__file__).parent))
        from distill_toy import ToyData, ToyDistillation
        from lightning_granndis.strategies import PipeBDStrategy
        return ToyDistillation(), PipeBDStrategy(mode="tr", schedule="even", profile_repeats=1), ToyData()
    raise SystemExit(f"unknown family {family}")


if slow_save:  # every checkpoint file takes this long to write: a kill lands inside a set's write
    from lightning_granndis.strategies import checkpoint_io

    original = checkpoint_io.atomic_torch_save

    def slow(obj, path):
        time.sleep(slow_save)
        original(obj, path)
        if restart == 0 and rank == kill_rank and f"step={kill_step}." in Path(path).name:
            os.kill(os.getpid(), signal.SIGKILL)  # its shard written, the set not yet committed

    checkpoint_io.atomic_torch_save = slow

pl.seed_everything(0)
module, strategy, dm = build()
trainer = pl.Trainer(
    accelerator="cpu", devices=4, strategy=strategy, max_steps=STEPS, logger=False, enable_progress_bar=False,
    enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
    callbacks=[ResumableCheckpoint(dirpath=str(out / "checkpoints"), every_n_train_steps=EVERY), Kill()]
    + ([ReplicaSnapshot(dirpath=str(SNAPSHOTS))] if how.startswith("replica") else []),
)
trainer.fit(module, datamodule=dm, ckpt_path="last")
state = {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}
if family == "pipeline":
    torch.save(state, out / f"final.{rank}.pt")
elif rank == 0:
    if family == "pipe_bd":
        state = module.assemble_student().state_dict()
    torch.save(state, out / "final.pt")
(out / f"steps.{rank}").write_text(str(trainer.global_step))
(out / f"resumed_from.{rank}").write_text(str(trainer.ckpt_path))
if rank == 0:
    (out / "resumed_from").write_text(str(trainer.ckpt_path))

from lightning_granndis import comm  # noqa: E402

comm.barrier()
comm.destroy()
