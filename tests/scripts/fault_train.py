"""A small run of one strategy family under torchrun, checkpointing with ResumableCheckpoint and
resuming with ``ckpt_path="last"``; faults are injected into its attempts.

usage: fault_train.py FAMILY OUT KILL_STEP KILL_RANK [SLOW_SAVE_S [HOW]]
FAMILY: ddp | gnn | pipeline | pipe_bd. One fault, on the first attempt (KILL_STEP -1: none):
HOW kill (default): SIGKILL rank KILL_RANK once KILL_STEP steps are done; stop: SIGSTOP it (a hung
rank; ddp's collective timeout is then 8 s); replica, replica_lost, replica_none: SIGKILL with a
ReplicaSnapshot every step (replica_lost: the killed rank's server loses its snapshots too;
replica_none: every server does). SLOW_SAVE_S > 0: every checkpoint file takes that long to write
and the kill lands inside the KILL_STEP set's write, once the rank's file is written and before
the set is committed (fault "write").

Or, for the fault benchmark, the environment sets FAULT_PLAN (JSON: one fault per attempt, each
{"kind": kill|stop|write|corrupt|replica|replica_lost, "step": s, "rank": r}), FAULT_STEPS,
FAULT_EVERY and FAULT_SNAPSHOTS (0/1). "corrupt" truncates the newest committed checkpoint, then
SIGKILLs rank r at step s. Every attempt appends what happened to OUT/events.jsonl.

Writes OUT/final.pt (rank 0: the parameters; pipeline: every rank its stage's),
OUT/attempts/<restart>.<rank>, OUT/steps.<rank> and OUT/resumed_from[.<rank>].
"""

import json
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

family, out = sys.argv[1], Path(sys.argv[2])
rank = int(os.environ["RANK"])
restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
if "FAULT_PLAN" in os.environ:
    PLAN = json.loads(os.environ["FAULT_PLAN"])
    STEPS, EVERY = int(os.environ["FAULT_STEPS"]), int(os.environ["FAULT_EVERY"])
    SNAPSHOT = os.environ.get("FAULT_SNAPSHOTS") == "1"
    slow_save = 0.0
else:
    kill_step, kill_rank = int(sys.argv[3]), int(sys.argv[4])
    slow_save = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0
    how = sys.argv[6] if len(sys.argv) > 6 else "kill"
    kind = "write" if slow_save else how
    PLAN = [{"kind": kind, "step": kill_step, "rank": kill_rank}] if kill_step >= 0 else []
    STEPS, EVERY, SNAPSHOT = 8, (4 if how.startswith("replica") else 2), how.startswith("replica")
FAULT = PLAN[restart] if restart < len(PLAN) else None
torch.set_num_threads(1)
(out / "attempts").mkdir(parents=True, exist_ok=True)
(out / "attempts" / f"{restart}.{rank}").touch()
SNAPSHOTS = out / "shm"  # each server's "node-local memory"


def record(**event) -> None:
    with open(out / "events.jsonl", "a") as f:
        f.write(json.dumps({"attempt": restart, "rank": rank, "time": time.time(), **event}) + "\n")


def die() -> None:
    record(event="fault", kind=FAULT["kind"], step=FAULT["step"])
    if FAULT["kind"] in ("replica_lost", "replica_none"):  # the machine's memory goes with it
        import shutil

        servers = [f"server{int(rank >= 2)}"] if FAULT["kind"] == "replica_lost" else ["server0", "server1"]
        for server in servers:
            shutil.rmtree(SNAPSHOTS / server, ignore_errors=True)
    os.kill(os.getpid(), signal.SIGSTOP if FAULT["kind"] == "stop" else signal.SIGKILL)


class Faults(Callback):
    """Injects this attempt's fault, and records where each attempt started."""

    def __init__(self):
        self.started = False

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if not self.started and rank == 0:
            record(event="first_step", resumed_step=trainer.global_step - 1, resumed_from=str(trainer.ckpt_path))
        self.started = True
        if FAULT is None or rank != FAULT["rank"] or trainer.global_step != FAULT["step"]:
            return
        if FAULT["kind"] == "corrupt":  # the newest committed set's file, truncated, then a kill
            newest = max((out / "checkpoints").glob("*.ckpt"), key=lambda p: p.stat().st_mtime)
            newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
            record(event="corrupted", path=str(newest))
        if FAULT["kind"] != "write":
            die()


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
        timeout = {"timeout": timedelta(seconds=8)} if any(f["kind"] == "stop" for f in PLAN) else {}
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
        # 2 stages x 2 replicas; compressed backward with error feedback (its residuals resume too).
        # A fixed split: a profiled one can differ between two independent runs on a busy machine
        # (moving the compressed boundary), and the faulted run is compared with a separate
        # uninterrupted one. (A resume keeps its checkpoint's split; tested in test_optimus_cc.)
        return model, CompressedPipelineStrategy(stages=2, microbatches=2, servers=2, link_model="10gbe",
                                                 compress_backward=True, rank=4, balance=[2, 2]), Tokens()
    if family == "pipe_bd":
        sys.path.insert(0, str(Path(__file__).parent))
        from distill_toy import ToyData, ToyDistillation
        from lightning_granndis.strategies import PipeBDStrategy
        return ToyDistillation(), PipeBDStrategy(mode="tr", schedule="even", profile_repeats=1), ToyData()
    raise SystemExit(f"unknown family {family}")


if FAULT is not None and FAULT["kind"] == "write":  # a kill between writing a file and committing the set
    from lightning_granndis.strategies import checkpoint_io

    original = checkpoint_io.atomic_torch_save

    def write_then_die(obj, path):
        time.sleep(slow_save)
        original(obj, path)
        if rank == FAULT["rank"] and f"step={FAULT['step']}." in Path(path).name:
            die()  # its file written, the set not yet committed

    checkpoint_io.atomic_torch_save = write_then_die

pl.seed_everything(0)
module, strategy, dm = build()
trainer = pl.Trainer(
    accelerator="cpu", devices=4, strategy=strategy, max_steps=STEPS, logger=False, enable_progress_bar=False,
    enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
    callbacks=[ResumableCheckpoint(dirpath=str(out / "checkpoints"), every_n_train_steps=EVERY), Faults()]
    + ([ReplicaSnapshot(dirpath=str(SNAPSHOTS))] if SNAPSHOT else []),
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
    record(event="finished", steps=trainer.global_step)

from lightning_granndis import comm  # noqa: E402

comm.barrier()
comm.destroy()
