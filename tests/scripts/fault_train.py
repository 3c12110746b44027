"""A small run of one strategy family under torchrun, written as a user writes a training script,
checkpointing with ResumableCheckpoint and resuming with ``ckpt_path="last"``; faults are injected
into its attempts.

Every family validates every epoch (a best-2 ``ResumableCheckpoint(monitor="val_loss")``, gnn: "val_acc", beside
the resume sets) and keeps each validation's metrics (OUT/history.json). ddp: an MLP with BatchNorm
and dropout, Adam + OneCycle per step, gradient accumulation 2, a shuffled loader with 2 worker
processes whose rows draw augmentation noise (tests/scripts/user_train.py); gnn: a user's PyG GCN with
BatchNorm and dropout under granndis CoB, a per-step schedule, accumulation 2; pipeline: GPT with
dropout, warm-up + cosine per step, accumulation 2, shuffled tokens read by 2 workers, compressed
backward with error feedback; pipe_bd: the toy distillation, shuffled, 2 workers.

usage: fault_train.py FAMILY OUT KILL_STEP KILL_RANK [SLOW_SAVE_S [HOW]]
FAMILY: ddp | gnn | pipeline | pipe_bd. One fault, on the first attempt (KILL_STEP -1: none):
HOW kill (default): SIGKILL rank KILL_RANK once KILL_STEP steps are done; stop: SIGSTOP it (a hung
rank; ddp's collective timeout is then 8 s); val: SIGKILL it in the first validation batch after
KILL_STEP; prefetch: SIGKILL it from inside its DataLoader worker's next read after KILL_STEP;
replica, replica_lost, replica_none: SIGKILL with a ReplicaSnapshot every step (replica_lost: the
killed rank's server loses its snapshots too; replica_none: every server does). SLOW_SAVE_S > 0:
every checkpoint file takes that long to write and the kill lands inside the KILL_STEP set's write,
once the rank's file is written and before the set is committed (fault "write").

Or, for the fault benchmark, the environment sets FAULT_PLAN (JSON: one fault per attempt, each
{"kind": kill|stop|val|prefetch|write|corrupt|replica|replica_lost, "step": s, "rank": r}),
FAULT_STEPS, FAULT_EVERY and FAULT_SNAPSHOTS (0/1). "corrupt" truncates the newest committed resume
set, then SIGKILLs rank r at step s. Every attempt appends what happened to OUT/events.jsonl.

Writes OUT/final.pt (rank 0: the parameters; pipeline: every rank its stage's), OUT/history.json
(rank 0: every validation's metrics, the best-k scores), OUT/attempts/<restart>.<rank>,
OUT/steps.<rank> and OUT/resumed_from[.<rank>].
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


def die(step: int) -> None:
    record(event="fault", kind=FAULT["kind"], step=step)
    if FAULT["kind"] in ("replica_lost", "replica_none"):  # the machine's memory goes with it
        import shutil

        servers = [f"server{int(rank >= 2)}"] if FAULT["kind"] == "replica_lost" else ["server0", "server1"]
        for server in servers:
            shutil.rmtree(SNAPSHOTS / server, ignore_errors=True)
    os.kill(os.getpid(), signal.SIGSTOP if FAULT["kind"] == "stop" else signal.SIGKILL)


class Faults(Callback):
    """Injects this attempt's fault, and records where each attempt started: at step ``s`` (its
    first batch), or for ``val`` in the first validation batch after step ``s``, or for
    ``prefetch`` in a DataLoader worker's next read after step ``s``."""

    def __init__(self):
        self.started = False
        self.resumed_step = 0

    def on_train_start(self, trainer, pl_module):
        self.resumed_step = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if not self.started and rank == 0:
            record(event="first_step", resumed_step=self.resumed_step, resumed_from=str(trainer.ckpt_path))
        self.started = True
        if KillFlag.path().exists():  # a prefetch fault pending: the worker that reads next kills us
            KillFlag.set(trainer.global_step)
        if FAULT is None or rank != FAULT["rank"] or trainer.global_step != FAULT["step"] or FAULT["kind"] == "val":
            return
        if FAULT["kind"] == "corrupt":  # the newest committed resume set's file, truncated, then a kill
            newest = max((out / "checkpoints").glob("resume-*.ckpt"), key=lambda p: p.stat().st_mtime)
            newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
            record(event="corrupted", path=str(newest))
        if FAULT["kind"] == "prefetch":  # the rank's next worker read kills it (and records the fault)
            KillFlag.set(trainer.global_step)
        elif FAULT["kind"] != "write":
            die(trainer.global_step)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if (FAULT is not None and FAULT["kind"] == "val" and rank == FAULT["rank"] and not trainer.sanity_checking
                and trainer.global_step >= FAULT["step"]):
            die(trainer.global_step)


# The ddp family is the ordinary user script of user_train.py: an MLP with BatchNorm and dropout,
# Adam with a per-step OneCycle schedule, gradient accumulation, a shuffled loader with 2 worker
# processes and a worker_init_fn (its rows draw augmentation noise in the workers), validation every
# epoch watched by a best-2 ResumableCheckpoint(monitor="val_loss").
# 32 rows per rank, batches of 4, accumulating 2: an epoch is 4 steps.
# (the schedule's length is fixed: a test extends a 6-step run to the 8-step reference)
os.environ["USER_RUN"] = json.dumps({"steps": STEPS, "schedule_steps": 100, "rows": 128, "batch": 4, "accumulate": 2, "num_workers": 2,
                                     "early_stopping": False})
sys.path.insert(0, str(Path(__file__).parent))
import user_train  # noqa: E402


class KillFlag:
    """A "prefetch" fault: the rank sets a flag file; its next DataLoader worker to read a row
    SIGKILLs the rank (its parent) and itself, inside the worker's prefetch."""

    @staticmethod
    def path() -> Path:
        return out / f"kill_in_worker.{rank}"

    @staticmethod
    def set(step: int) -> None:
        """Raised (or kept raised) at ``step``: the steps the rank has done when a worker reads it."""
        tmp = KillFlag.path().with_suffix(".tmp")
        tmp.write_text(str(step))
        os.replace(tmp, KillFlag.path())

    @staticmethod
    def check() -> None:
        if KillFlag.path().exists():
            try:
                step = int(KillFlag.path().read_text())
            except (OSError, ValueError):
                return  # (lowered meanwhile)
            KillFlag.path().unlink(missing_ok=True)
            record(event="fault", kind="prefetch", step=step)  # the steps done when the rank dies
            os.kill(os.getppid(), signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)


class WorkerData(user_train.Noisy):
    def __getitem__(self, i):
        KillFlag.check()
        return super().__getitem__(i)


class WorkerTensors(TensorDataset):
    def __getitem__(self, i):
        KillFlag.check()
        return super().__getitem__(i)


class UserDDPModel(user_train.UserModel):
    def train_dataloader(self):
        return self.loader(WorkerData(user_train.RUN["rows"], 0), shuffle=True)


class Tokens(pl.LightningDataModule):
    """Random token sequences; shuffled training batches read by 2 worker processes."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.ids = torch.randint(0, 64, (80, 17), generator=g)

    def train_dataloader(self):
        data = WorkerTensors(self.ids[:64, :-1], self.ids[:64, 1:])
        return DataLoader(data, batch_size=4, shuffle=True, num_workers=2, worker_init_fn=user_train.seed_worker)

    def val_dataloader(self):
        return DataLoader(TensorDataset(self.ids[64:, :-1], self.ids[64:, 1:]), batch_size=8)


def build():
    """(module, strategy, datamodule or None, trainer settings)."""
    validation = {"check_val_every_n_epoch": 1}
    if family == "ddp":
        from lightning_granndis.strategies import ServerAwareDDPStrategy
        from datetime import timedelta

        # a stopped rank makes its peers' collectives time out after 8 s
        timeout = {"timeout": timedelta(seconds=8)} if any(f["kind"] == "stop" for f in PLAN) else {}
        return (UserDDPModel(), ServerAwareDDPStrategy(servers=2, link_model="10gbe", **timeout), None,
                {**validation, "accumulate_grad_batches": 2})
    if family == "gnn":
        from lightning_granndis.datamodules import OGBNodeDataModule
        from lightning_granndis.strategies import ServerAwareGNNStrategy
        dm = OGBNodeDataModule("synthetic-tiny", root=str(out.parent / "data"))
        # Cooperative Batching, 4 co-batches an epoch drawn afresh each epoch (its sampler resumes
        # too); a user's PyG GCN, the strategy's exact validation (val_acc) every epoch
        return (user_train.UserGCN(), ServerAwareGNNStrategy(servers=2, mode="cob", iterations=4, link_model="10gbe"),
                dm, {**validation, "accumulate_grad_batches": 2})
    if family == "pipeline":
        from lightning_granndis.models import GPT
        from lightning_granndis.strategies import CompressedPipelineStrategy

        model = GPT(vocab_size=64, block_size=16, hidden=32, layers=2, heads=2, dropout=0.1, warmup_steps=4)
        # 2 stages x 2 replicas; compressed backward with error feedback (its residuals resume too).
        # A fixed split: a profiled one can differ between two independent runs on a busy machine
        # (moving the compressed boundary), and the faulted run is compared with a separate
        # uninterrupted one. (A resume keeps its checkpoint's split; tested in test_optimus_cc.)
        return model, CompressedPipelineStrategy(stages=2, microbatches=2, servers=2, link_model="10gbe",
                                                 compress_backward=True, rank=4, balance=[2, 2]), Tokens(), \
            {**validation, "accumulate_grad_batches": 2}
    if family == "pipe_bd":
        from distill_toy import ToyData, ToyDistillation
        from lightning_granndis.strategies import PipeBDStrategy

        class ShuffledToyData(ToyData):
            def train_dataloader(self):
                return DataLoader(WorkerTensors(self.x[:32], self.y[:32]), batch_size=self.batch_size, shuffle=True,
                                  num_workers=2, worker_init_fn=user_train.seed_worker)

        return ToyDistillation(), PipeBDStrategy(mode="tr", schedule="even", profile_repeats=1), ShuffledToyData(), \
            validation
    raise SystemExit(f"unknown family {family}")


if FAULT is not None and FAULT["kind"] == "write":  # a kill between writing a file and committing the set
    from lightning_granndis.strategies import checkpoint_io

    original = checkpoint_io.atomic_torch_save

    def write_then_die(obj, path):
        time.sleep(slow_save)
        original(obj, path)
        if rank == FAULT["rank"] and f"step={FAULT['step']}." in Path(path).name:
            die(FAULT["step"])  # its file written, the set not yet committed

    checkpoint_io.atomic_torch_save = write_then_die

pl.seed_everything(0)
module, strategy, dm, settings = build()
# granndis validates exactly over the whole graph and logs val_acc
monitor = {"monitor": "val_acc", "mode": "max", "save_top_k": 2} if family == "gnn" else {"monitor": "val_loss", "save_top_k": 2}
saver = ResumableCheckpoint(dirpath=str(out / "checkpoints"), every_n_train_steps=EVERY, **monitor)
history = user_train.History()
trainer = pl.Trainer(
    accelerator="cpu", devices=4, strategy=strategy, max_steps=STEPS, logger=False, enable_progress_bar=False,
    enable_model_summary=False, callbacks=[saver, history, Faults()]
    + ([ReplicaSnapshot(dirpath=str(SNAPSHOTS))] if SNAPSHOT else []), **settings,
)
try:
    trainer.fit(module, datamodule=dm, ckpt_path="last")
except BaseException as error:  # what this rank said when it failed (a hang's peers name the rank)
    record(event="failed", message="\n".join([str(error)[:2000], *getattr(error, "__notes__", [])]))
    raise
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
    (out / "history.json").write_text(json.dumps({
        "validations": history.rows, "best_k": sorted(float(v) for v in saver.best_k_models.values())}))
    record(event="finished", steps=trainer.global_step)

from lightning_granndis import comm  # noqa: E402

comm.barrier()
comm.destroy()
