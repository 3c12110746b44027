"""Logs the communication ledger and prints and plots its breakdown at the end of ``fit``."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn
from typing_extensions import override

from lightning_granndis import comm
from lightning_granndis.ledger import CommLedger
from lightning_granndis.report import (
    BREAKDOWN_HEADERS,
    TIME_CATEGORIES,
    breakdown_rows,
    markdown_table,
    plot_breakdown,
    plot_time_breakdown,
    time_breakdown,
)


class CommMonitor(Callback):
    """Reports where the strategy's communication went, by link class and purpose.

    Works with every strategy of this package (anything with a ``comm`` attribute holding a
    :class:`~lightning_granndis.comm.Communicator`). Logs to all the Trainer's loggers (wandb too):

    - every ``log_every_n_steps`` steps: ``comm_step/<link>/<purpose>/{bytes,seconds,modelled_seconds}``
      for the steps since the last log (bytes summed over ranks, seconds averaged per rank);
    - every epoch: the same under ``comm_epoch/``, and the epoch's training time split into the
      GraNNDis paper's four categories — ``time_epoch/{compute,intra_comm,inter_comm,grad_sync}_s``
      (seconds per rank, averaged over ranks; evaluation excluded).

    At the end of ``fit`` it prints a breakdown table, saves it as JSON (``comm_breakdown.json``)
    and as PNGs (``comm_breakdown.png`` by link and purpose, ``time_breakdown.png`` per epoch) in
    ``dirpath`` (default: the Trainer's log directory), and keeps it in :attr:`summary`
    (``summary["epochs"]`` holds the per-epoch time breakdowns).

    Args:
        log_every_n_steps: logging interval; default: the Trainer's ``log_every_n_steps``.
        dirpath: where the JSON and PNG go.
    """

    def __init__(self, log_every_n_steps: int | None = None, dirpath: str | None = None) -> None:
        self.log_every_n_steps = log_every_n_steps
        self.dirpath = dirpath
        self.summary: dict[str, Any] | None = None
        self._mark_step: CommLedger | None = None
        self._mark_epoch: CommLedger | None = None
        self.epochs: list[dict[str, float]] = []
        self._train_seconds = 0.0
        self._batch_t0 = 0.0

    @staticmethod
    def _comm(trainer: pl.Trainer) -> comm.Communicator | None:
        return getattr(trainer.strategy, "comm", None)

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._comm(trainer) is None:
            rank_zero_warn(
                f"CommMonitor: strategy {type(trainer.strategy).__name__} keeps no communication ledger; "
                "use a lightning_granndis strategy (e.g. strategy='server_aware_ddp')."
            )
            return
        ledger = self._comm(trainer).ledger
        self._mark_step = ledger.snapshot()
        self._mark_epoch = ledger.snapshot()
        self.epochs = []

    @override
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._batch_t0 = time.perf_counter()

    def _log_delta(self, trainer: pl.Trainer, since: CommLedger, prefix: str) -> CommLedger:
        ledger = self._comm(trainer).ledger
        mine = ledger.since(since).to_dict()
        parts = [CommLedger.from_dict(d) for d in comm.gather_objects(mine)]
        merged = CommLedger.merged(parts)
        if trainer.is_global_zero and trainer.loggers:
            metrics = merged.metrics(prefix)
            for key in metrics:
                if not key.endswith("/bytes"):
                    metrics[key] /= len(parts)
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=trainer.global_step)
        return ledger.snapshot()

    @override
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._train_seconds += time.perf_counter() - self._batch_t0
        if self._mark_step is None:
            return
        every = self.log_every_n_steps or trainer.log_every_n_steps
        if trainer.global_step % max(1, every) == 0:
            self._mark_step = self._log_delta(trainer, self._mark_step, "comm_step")

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._mark_epoch is None:
            return
        mine = time_breakdown(self._comm(trainer).ledger.since(self._mark_epoch), self._train_seconds)
        self._train_seconds = 0.0
        ranks = comm.gather_objects(mine)
        epoch = {k: sum(r[k] for r in ranks) / len(ranks) for k in mine}
        self.epochs.append(epoch)
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics({f"time_epoch/{k}_s": v for k, v in epoch.items()}, step=trainer.global_step)
        self._mark_epoch = self._log_delta(trainer, self._mark_epoch, "comm_epoch")

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        communicator = self._comm(trainer)
        if communicator is None:
            return
        parts = [CommLedger.from_dict(d) for d in comm.gather_objects(communicator.ledger.to_dict())]
        # trainer.log_dir is a collective (it broadcasts from rank 0): every rank asks for it.
        dirpath = Path(self.dirpath or trainer.log_dir or trainer.default_root_dir)
        if not trainer.is_global_zero:
            return
        merged = CommLedger.merged(parts)
        link_model = communicator.link_model
        mode = "emulated" if communicator.emulate else "modelled only, not emulated"
        title = f"communication over {len(parts)} ranks, {communicator.topology.describe()}; " \
                f"links: {link_model.describe()} [{mode}]"
        rows = breakdown_rows(merged, len(parts))
        table = markdown_table(BREAKDOWN_HEADERS, rows)
        dirpath.mkdir(parents=True, exist_ok=True)
        png = plot_breakdown(merged, len(parts), dirpath / "comm_breakdown.png", title)
        time_png = None
        if self.epochs:
            time_png = plot_time_breakdown(self.epochs, dirpath / "time_breakdown.png",
                                           f"training time per epoch, {communicator.topology.describe()} [{mode}]")
            rows = [[i, *(e[k] for k in (*TIME_CATEGORIES, "total"))] for i, e in enumerate(self.epochs)]
            time_table = markdown_table(("epoch", *(f"{k} s" for k in TIME_CATEGORIES), "total s"), rows)
        else:
            time_table = ""
        self.summary = {
            "title": title,
            "ranks": len(parts),
            "emulated": communicator.emulate,
            "link_scale": link_model.scale,
            "per_rank": [p.to_dict() for p in parts],
            "total": merged.to_dict(),
            "table": table,
            "png": str(png),
            "epochs": self.epochs,
            "time_table": time_table,
            "time_png": str(time_png) if time_png else None,
        }
        (dirpath / "comm_breakdown.json").write_text(json.dumps(self.summary, indent=2))
        print(f"\nCommunication breakdown — {title}\n{table}\nplot: {png}\n", flush=True)
        if time_table:
            print(f"Training time per epoch (seconds per rank)\n{time_table}\nplot: {time_png}\n", flush=True)
        for logger in trainer.loggers:
            if hasattr(logger, "log_image"):
                logger.log_image(key="comm_breakdown", images=[str(png)])
                if time_png:
                    logger.log_image(key="time_breakdown", images=[str(time_png)])
