"""An ordinary training script, as a user writes it from the README: their own LightningModule (an
MLP with BatchNorm1d and dropout, Adam with a per-step LR schedule, gradient accumulation), a
shuffled DataLoader with worker processes and a ``worker_init_fn``, a validation loop whose
metrics a ``ResumableCheckpoint(monitor=...)`` and ``EarlyStopping`` watch, and
``ServerAwareDDPStrategy``, resumed with ``trainer.fit(..., ckpt_path="last")``.

usage: user_train.py OUT [sweep]   (plain python, or under torchrun with ``devices`` ranks)

``family`` "gnn" trains ``UserGCN`` (OGB's GCN as a user writes it, with PyG's GCNConv) under
``ServerAwareGNNStrategy`` (Cooperative Batching on ``servers`` virtual servers) on the project's
synthetic-tiny graph, its validation the strategy's exact full-graph one (``val_acc``).

The run's settings come as JSON in ``USER_RUN`` (see ``SETTINGS``). Rank 0 writes OUT/final.pt (the
parameters and buffers) and OUT/final.json (steps, epochs, every validation's metrics, the best-k
checkpoints and their scores, the epoch EarlyStopping stopped at).

``sweep`` (one process): trains uninterrupted with a checkpoint set at every step, then, for
every set it wrote, resumes a fresh run in a fresh folder holding only that set and checks it ends
with the same parameters, the same validation history from the checkpoint on and the same best-k
scores. Prints ``RESULT {json}``: per checkpoint, what differed.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback, EarlyStopping
from torch.utils.data import DataLoader, Dataset

import lightning_granndis  # noqa: F401
from lightning_granndis.callbacks import ResumableCheckpoint
from lightning_granndis.strategies import ServerAwareDDPStrategy

SETTINGS = dict(
    steps=14,  # optimizer steps
    schedule_steps=None,  # the OneCycle schedule's length (default steps + 1)
    devices=1, servers=1,
    rows=48, batch=4, accumulate=2,
    num_workers=2, persistent_workers=False,
    val_every_n_epochs=1, val_check_interval=None, limit_val_batches=None,
    every_n_train_steps=2, every_n_epochs=None, keep=2,
    monitor="val_loss", mode="min", save_top_k=2,
    early_stopping=True,
    family="mlp",  # or "gnn"
    data_root=None,  # gnn: where the synthetic graph is generated (default OUT/data)
    timeout_s=None,
)
RUN = {**SETTINGS, **json.loads(os.environ.get("USER_RUN", "{}"))}
RANK = int(os.environ.get("RANK", "0"))


class Noisy(Dataset):
    """Rows whose every read draws from the worker's generators (as augmentation does)."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 8, generator=g)
        self.y = (self.x[:, 0] > 0).long() + (self.x[:, 1] > 0).long()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        jitter = 0.01 * torch.randn(8) + 0.01 * float(np.random.rand())
        return self.x[i] + jitter, self.y[i]


def seed_worker(worker_id):  # PyTorch's reproducibility recipe
    seed = torch.initial_seed() % 2 ** 32
    np.random.seed(seed)


class UserModel(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(),
                                       torch.nn.Dropout(0.3), torch.nn.Linear(32, 3))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        # a draw from the global generator during validation (as MC-dropout or a sampled metric does)
        noise = 1e-3 * torch.rand(())
        self.log("val_loss", torch.nn.functional.cross_entropy(logits, y) + noise, sync_dist=True)
        self.log("val_acc", (logits.argmax(-1) == y).float().mean(), sync_dist=True)

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=0.01)
        schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.02, total_steps=RUN["schedule_steps"] or RUN["steps"] + 1)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    def loader(self, data, shuffle):
        workers = RUN["num_workers"]
        return DataLoader(data, batch_size=RUN["batch"], shuffle=shuffle, num_workers=workers,
                          worker_init_fn=seed_worker if workers else None,
                          persistent_workers=RUN["persistent_workers"] and workers > 0)

    def train_dataloader(self):
        return self.loader(Noisy(RUN["rows"], 0), shuffle=True)

    def val_dataloader(self):
        return self.loader(Noisy(16, 1), shuffle=False)


class History(Callback):
    """Every validation's metrics, (step, epoch, metrics), kept in the checkpoint as a user's own
    callback state would be: a resumed run's history is the checkpoint's plus what it adds."""

    def __init__(self):
        self.rows: list[dict] = []

    def on_validation_end(self, trainer, pl_module):
        if trainer.sanity_checking:
            return
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val_")}
        self.rows.append({"step": trainer.global_step, "epoch": trainer.current_epoch, **metrics})

    def state_dict(self):
        return {"rows": json.dumps(self.rows)}

    def load_state_dict(self, state_dict):
        self.rows = json.loads(state_dict["rows"])


class UserGCN(pl.LightningModule):
    """OGB's arxiv GCN as a user writes it (GCNConv + BatchNorm1d + ReLU + dropout), with a validation
    step and Adam under a per-step schedule."""

    def __init__(self, in_channels=32, hidden=16, classes=8):
        super().__init__()
        from torch_geometric.nn import GCNConv

        # no bias before the BatchNorm (it cancels it): its gradient is zero up to rounding, which
        # Adam would turn into steps of lr
        self.convs = torch.nn.ModuleList([GCNConv(in_channels, hidden, bias=False), GCNConv(hidden, classes)])
        self.bn = torch.nn.BatchNorm1d(hidden)

    def forward(self, x, edge_index):
        x = torch.nn.functional.dropout(torch.relu(self.bn(self.convs[0](x, edge_index))), 0.3, self.training)
        return self.convs[1](x, edge_index)

    def training_step(self, batch, batch_idx):
        logits = self(batch.x, batch.edge_index)
        loss = torch.nn.functional.cross_entropy(logits[batch.train_mask], batch.y[batch.train_mask])
        self.log("train_loss", loss, batch_size=1)
        return loss

    def validation_step(self, batch, batch_idx):  # (granndis' exact evaluation logs val_acc instead)
        logits = self(batch.x, batch.edge_index)
        loss = torch.nn.functional.cross_entropy(logits[batch.val_mask], batch.y[batch.val_mask])
        self.log("val_loss", loss, sync_dist=True, batch_size=1)

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=0.01)
        schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.02, total_steps=RUN["schedule_steps"] or RUN["steps"] + 1)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def build(out: Path):
    """(module, strategy, datamodule or None) of the run's family."""
    timeout = {}
    if RUN["timeout_s"]:
        from datetime import timedelta
        timeout["timeout"] = timedelta(seconds=RUN["timeout_s"])
    if RUN["family"] == "gnn":
        from lightning_granndis.datamodules import OGBNodeDataModule
        from lightning_granndis.strategies import ServerAwareGNNStrategy

        dm = OGBNodeDataModule("synthetic-tiny", root=RUN["data_root"] or str(out.parent / "data"))
        strategy = ServerAwareGNNStrategy(servers=RUN["servers"], mode="cob", iterations=4, **timeout)
        return UserGCN(), strategy, dm
    return UserModel(), ServerAwareDDPStrategy(servers=RUN["servers"], **timeout), None


def fit(out: Path, ckpt_path="last", every_n_train_steps=None, keep=None, extra_callbacks=(), checkpoints=None):
    """One run into ``out`` (checkpoints in ``checkpoints``, default ``out/checkpoints``); returns
    (trainer, module, saver)."""
    out.mkdir(parents=True, exist_ok=True)
    pl.seed_everything(0)
    model, strategy, datamodule = build(out)
    if RUN["every_n_epochs"]:
        every_n_train_steps = None
    saver = ResumableCheckpoint(dirpath=str(checkpoints or out / "checkpoints"),
                                every_n_train_steps=every_n_train_steps or RUN["every_n_train_steps"],
                                every_n_epochs=RUN["every_n_epochs"], keep=keep or RUN["keep"],
                                **({"monitor": RUN["monitor"], "mode": RUN["mode"], "save_top_k": RUN["save_top_k"]}
                                   if RUN["monitor"] else {}))
    callbacks = [saver, History(), *extra_callbacks]
    if RUN["early_stopping"]:
        callbacks.append(EarlyStopping(monitor=RUN["monitor"] or "val_loss", mode=RUN["mode"], patience=1,
                                       min_delta=0.02))
    trainer = pl.Trainer(
        accelerator="cpu", devices=RUN["devices"], strategy=strategy,
        max_steps=RUN["steps"], accumulate_grad_batches=RUN["accumulate"], logger=False,
        enable_progress_bar=False, enable_model_summary=False,
        check_val_every_n_epoch=RUN["val_every_n_epochs"], val_check_interval=RUN["val_check_interval"],
        limit_val_batches=RUN["limit_val_batches"], callbacks=callbacks,
    )
    trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    return trainer, model, saver


def finish(out: Path, trainer, model, saver) -> None:
    if trainer.global_rank != 0:
        return
    torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, out / "final.pt")
    stopper = next((c for c in trainer.callbacks if isinstance(c, EarlyStopping)), None)
    (out / "final.json").write_text(json.dumps({
        "steps": trainer.global_step, "epoch": trainer.current_epoch,
        "best_k": {Path(k).name: float(v) for k, v in saver.best_k_models.items()},
        "best": Path(saver.best_model_path).name if saver.best_model_path else None,
        "stopped_epoch": stopper.stopped_epoch if stopper is not None else None,
        "history": next(c for c in trainer.callbacks if isinstance(c, History)).rows,
    }))


def differences(reference: Path, resumed: Path) -> list[str]:
    found = []
    a, b = torch.load(reference / "final.pt"), torch.load(resumed / "final.pt")
    worst = max((a[k].float() - b[k].float()).abs().max().item() for k in a)
    if worst > 1e-6:
        found.append(f"parameters differ by {worst:.3g}")
    fa, fb = json.loads((reference / "final.json").read_text()), json.loads((resumed / "final.json").read_text())
    ha, hb = fa.pop("history"), fb.pop("history")
    if [(r["step"], r["epoch"]) for r in ha] != [(r["step"], r["epoch"]) for r in hb]:
        found.append(f"validations at (step, epoch) {[(r['step'], r['epoch']) for r in hb]} instead of "
                     f"{[(r['step'], r['epoch']) for r in ha]}")
    elif any(abs(x[m] - y.get(m, float("nan"))) > 1e-6 for x, y in zip(ha, hb) for m in x if m.startswith("val_")):
        found.append("validation metrics differ")
    for key in ("steps", "epoch", "stopped_epoch"):
        if fa[key] != fb[key]:
            found.append(f"{key} {fb[key]} instead of {fa[key]}")
    scores_a, scores_b = sorted(fa["best_k"].values()), sorted(fb["best_k"].values())
    if len(scores_a) != len(scores_b) or any(abs(x - y) > 1e-6 for x, y in zip(scores_a, scores_b)):
        found.append(f"best-k scores {scores_b} instead of {scores_a}")
    return found


def sweep(out: Path) -> None:
    from lightning_granndis import comm
    from lightning_granndis.checkpoint_sets import SUFFIX, read_set

    reference, folder = out / "uninterrupted", out / "checkpoints"  # every run saves into one folder
    finish(reference, *fit(reference, ckpt_path=None, every_n_train_steps=1, keep=1000, checkpoints=folder))
    saved = out / "saved"
    if RANK == 0:  # (under torchrun, rank 0 moves the files while the others wait)
        folder.rename(saved)
    comm.barrier()
    result = {}
    for record in sorted(saved.glob(f"{ResumableCheckpoint.resume_prefix}*{SUFFIX}")):
        checkpoint = record.with_name(record.name[: -len(SUFFIX)])
        if read_set(checkpoint)[0].step >= RUN["steps"]:
            # the last step's set resumes a finished run (Lightning then runs nothing, not even the
            # rest of the last epoch's end); what it is for is a longer run
            continue
        if RANK == 0:  # the set, and the best-k sets it lists (as the folder held them when it was saved)
            state = torch.load(checkpoint, weights_only=True)
            listed = next(v for k, v in state["callbacks"].items() if k.startswith("ResumableCheckpoint"))
            names = [checkpoint.name] + [Path(p).name for p in listed["best_k_models"]]
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            for name in names:
                for f in [*read_set(saved / name)[0].files, saved / (name + SUFFIX)]:
                    shutil.copy2(f, folder / Path(f).name)
        comm.barrier()
        run = out / f"from_{checkpoint.stem}"
        try:
            finish(run, *fit(run, every_n_train_steps=1, keep=1000, checkpoints=folder))
            result[checkpoint.name] = differences(reference, run) if RANK == 0 else []
        except Exception as error:  # noqa: BLE001 - reported
            result[checkpoint.name] = [f"raised {type(error).__name__}: {str(error)[:300]}"]
    if RANK == 0:
        print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    out = Path(sys.argv[1])
    if len(sys.argv) > 2 and sys.argv[2] == "sweep":
        sweep(out)
    else:
        finish(out, *fit(out))
    from lightning_granndis import comm

    comm.barrier()
    comm.destroy()
