"""Checkpoints a restarted run resumes from by itself: ``trainer.fit(..., ckpt_path="last")``."""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from typing_extensions import override

from lightning_granndis.checkpoint_sets import newest_complete
from lightning_granndis.strategies.loop_state import (
    restore_unsaved_trainer_state,
    settle_epoch_start,
    unsaved_trainer_state,
)

# Lightning's advice when ckpt_path="last" finds nothing ("Set save_last=True") is wrong here: a
# first start has nothing to resume yet; ResumableCheckpoint says so itself.
warnings.filterwarnings("ignore", message=r'.*ckpt_path="last"\) is set, but there is no last checkpoint')

_STEP = re.compile(r"step=(\d+)")


class _EpochStart(Callback):
    """Runs first at every epoch's start (Lightning runs checkpoint callbacks last): a resume set
    taken there is the state the uninterrupted run had before any hook of the new epoch."""

    def __init__(self, owner: "ResumableCheckpoint") -> None:
        self.owner = owner

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.owner._save_pending(trainer)


class ResumableCheckpoint(ModelCheckpoint):
    """A :class:`~lightning.pytorch.callbacks.ModelCheckpoint` that keeps *resume sets* (the
    ``keep`` newest, every ``every_n_train_steps`` steps or ``every_n_epochs`` epochs, under a
    fixed ``dirpath``) and makes ``trainer.fit(model, ckpt_path="last")`` resume from the newest
    *complete* one; beside them, with ``monitor``, the best ``save_top_k`` checkpoints as
    ``ModelCheckpoint`` keeps them.

    Under ``torchrun --max-restarts=N`` every restarted worker runs the same script again; with
    ``ckpt_path="last"`` each finds the same newest resume set whose commit record verifies
    (every file present, of the recorded size and SHA-256; see
    :mod:`~lightning_granndis.checkpoint_sets`, written by this suite's strategies), skips newer
    ones that are incomplete, truncated or corrupt with a warning naming the file, and resumes. A
    first run (nothing saved yet) starts from scratch. A killed worker costs at most the steps since
    the last resume set.

    A resumed run continues as the uninterrupted run did: the same batches, random numbers,
    validations and metrics. A resume set due on a step after which validation runs is taken when
    that validation has ended, and one due as an epoch ends is taken once the epoch is over
    (validation, ``on_train_epoch_end`` hooks, epoch LR schedulers, ``EarlyStopping``), at the next
    epoch's start or the end of training. Each set also keeps what Lightning's checkpoints leave
    out: the metrics callbacks last saw (a resumed ``EarlyStopping`` or ``ModelCheckpoint`` compares
    against the same values) and whether the run was told to stop.

    Best-k sets are committed like every checkpoint and their record (``best_model_path``,
    ``best_k_models``) resumes with the run; a set that falls out of the best ``k`` is deleted once
    no kept resume set predates that, so a resume never names a best set that is gone.

    Args:
        dirpath: where the checkpoints go (required: a restarted run must find the same folder,
            which Lightning's default, a new logger version per run, would not be).
        every_n_train_steps, every_n_epochs: how often to save (as ``ModelCheckpoint``; default
            every epoch).
        keep: newest resume sets kept (default 2: if the newest is damaged, the one before it is
            still there to resume from).
        checksum: verify SHA-256 when choosing (default ``True``; sizes are always checked).
        monitor, mode, save_top_k, filename: the best-k checkpoints, as ``ModelCheckpoint``
            (``save_top_k`` defaults to 1 with a ``monitor``; without one there are none).
        **kwargs: passed on to ``ModelCheckpoint``.
    """

    resume_prefix = "resume-"

    def __init__(self, dirpath: str, every_n_train_steps: int | None = None, every_n_epochs: int | None = None,
                 keep: int = 2, checksum: bool = True, monitor: str | None = None, mode: str = "min",
                 save_top_k: int | None = None, filename: str | None = None, **kwargs: Any) -> None:
        if not dirpath:
            raise ValueError("ResumableCheckpoint needs a dirpath: a restarted run must find its checkpoints in "
                             "the same folder (e.g. dirpath='runs/my_run/checkpoints').")
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}.")
        if monitor is None and save_top_k not in (None, 0):
            raise ValueError(f"ResumableCheckpoint(save_top_k={save_top_k}) needs a monitor to rank checkpoints by "
                             "(e.g. monitor='val_loss'); the newest resume sets are kept by keep=.")
        if every_n_train_steps is None and every_n_epochs is None:
            every_n_epochs = 1
        if save_top_k is None:
            save_top_k = 1 if monitor is not None else 0
        super().__init__(dirpath=dirpath, filename=filename, monitor=monitor, mode=mode, save_top_k=save_top_k,
                         every_n_train_steps=every_n_train_steps, every_n_epochs=every_n_epochs, **kwargs)
        self.keep = keep
        self.checksum = checksum
        self.resume_candidates: set[str] | None = None  # what ckpt_path="last" found here (None: not asked)
        self.resume_sets: list[str] = []  # this run's resume sets, oldest first
        self.dropped_best: list[tuple[str, int]] = []  # (best-k set no longer among the best, its step)
        self._pending = False  # a resume set due, waiting for the validation or epoch end to finish
        self._last_resume_step = 0  # nothing to save before the first step
        self._saving_at_epoch_start = False
        self._unsaved_state: dict | None = None

    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(monitor=self.monitor, every_n_train_steps=self._every_n_train_steps,
                                        every_n_epochs=self._every_n_epochs, resumable=True)

    # ------------------------------------------------------------------ when resume sets are taken
    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if not any(isinstance(cb, _EpochStart) and cb.owner is self for cb in trainer.callbacks):
            trainer.callbacks.insert(0, _EpochStart(self))
        self._pending = False

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        if self._unsaved_state is not None:  # what the resumed checkpoint kept beside Lightning's state
            restore_unsaved_trainer_state(trainer, self._unsaved_state)
            self._unsaved_state = None

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        n = self._every_n_train_steps
        if n < 1 or trainer.global_step % n != 0 or not self._may_save(trainer):
            return
        # (a run stopped by max_steps inside an epoch saves at once, mid-epoch: a longer run resumed
        # from it goes on with that epoch's remaining batches)
        epoch_ends = trainer.fit_loop.epoch_loop._num_ready_batches_reached()
        if epoch_ends or self._validation_follows(trainer):
            self._pending = True  # taken once the validation (or the whole epoch end) is over
        else:
            self._save_resume_set(trainer)

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if self._pending and not trainer.fit_loop.epoch_loop._num_ready_batches_reached():
            self._save_resume_set(trainer)  # a validation inside the epoch has ended

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        n = self._every_n_epochs
        if n >= 1 and (trainer.current_epoch + 1) % n == 0 and self._may_save(trainer):
            self._pending = True

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_end(trainer, pl_module)
        self._save_pending(trainer)

    def _may_save(self, trainer: pl.Trainer) -> bool:
        from lightning.pytorch.trainer.states import TrainerFn

        return (not trainer.fast_dev_run and trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking
                and trainer.global_step != self._last_resume_step)

    @staticmethod
    def _validation_follows(trainer: pl.Trainer) -> bool:
        """Whether Lightning validates right after this batch (it decides it the same way)."""
        epoch_loop = trainer.fit_loop.epoch_loop
        fetcher = trainer.fit_loop._data_fetcher
        if fetcher is None or not epoch_loop._should_check_val_fx(fetcher):
            return False
        batches = trainer.num_val_batches
        return bool(sum(batches) if isinstance(batches, list) else batches)

    def _save_pending(self, trainer: pl.Trainer) -> None:
        if self._pending:
            self._saving_at_epoch_start = True
            try:
                self._save_resume_set(trainer)
            finally:
                self._saving_at_epoch_start = False

    # ------------------------------------------------------------------ writing and pruning sets
    def resume_set_path(self, trainer: pl.Trainer) -> str:
        return str(Path(self.dirpath) / f"{self.resume_prefix}epoch={trainer.current_epoch}-step={trainer.global_step}"
                                         f"{self.FILE_EXTENSION}")

    def _save_resume_set(self, trainer: pl.Trainer) -> None:
        self._pending = False
        self._last_resume_step = trainer.global_step
        path = self.resume_set_path(trainer)
        if path not in self.resume_sets:
            self.resume_sets.append(path)  # before saving: the set's own state lists it
        self._write_resume_set(trainer, path)
        while len(self.resume_sets) > self.keep:
            self._delete_set(trainer, self.resume_sets.pop(0))
        oldest = min((_step_of(p) for p in self.resume_sets), default=trainer.global_step)
        for path, step in [d for d in self.dropped_best if d[1] <= oldest]:
            self._delete_set(trainer, path)  # no kept resume set still lists it among the best
            self.dropped_best.remove((path, step))

    def _write_resume_set(self, trainer: pl.Trainer, path: str) -> None:
        trainer.save_checkpoint(path, self.save_weights_only)

    def _delete_set(self, trainer: pl.Trainer, path: str) -> None:
        trainer.strategy.remove_checkpoint(path)

    @override
    def _remove_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
        # a best-k set that drops out: kept until no resume set lists it (see _save_resume_set)
        if Path(filepath).name.startswith(self.resume_prefix) or not self.resume_prefix:
            return super()._remove_checkpoint(trainer, filepath)
        self.dropped_best.append((filepath, trainer.global_step))

    # ------------------------------------------------------------------ what a set keeps, and resuming
    @override
    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        super().on_save_checkpoint(trainer, pl_module, checkpoint)
        if self._saving_at_epoch_start:  # the epoch is over: resume at the next one's start
            settle_epoch_start(checkpoint)
        checkpoint["unsaved_trainer_state"] = unsaved_trainer_state(trainer)

    @override
    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        super().on_load_checkpoint(trainer, pl_module, checkpoint)
        self._unsaved_state = checkpoint.get("unsaved_trainer_state")

    @override
    def state_dict(self) -> dict[str, Any]:
        # (and ModelCheckpoint's own decisions in flight, which Lightning does not save)
        return {**super().state_dict(), "resume_sets": list(self.resume_sets),
                "dropped_best": [list(d) for d in self.dropped_best], "last_resume_step": self._last_resume_step,
                "last_global_step_saved": self._last_global_step_saved,
                "defer_save_until_validation": self._defer_save_until_validation}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        if state_dict.get("dirpath", self.dirpath) == self.dirpath:
            self.resume_sets = list(state_dict.get("resume_sets", []))
            self.dropped_best = [(p, int(s)) for p, s in state_dict.get("dropped_best", [])]
        self._last_resume_step = int(state_dict.get("last_resume_step", 0))
        self._last_global_step_saved = int(state_dict.get("last_global_step_saved", self._last_global_step_saved))
        self._defer_save_until_validation = bool(state_dict.get("defer_save_until_validation", False))

    @override
    def _find_last_checkpoints(self, trainer: pl.Trainer) -> set[str]:
        # resume sets only: a best-k set is taken where Lightning takes it (before the epoch's end
        # is over), a point a run does not resume from exactly (resumed from one, a run ended 0.01 off)
        found, skipped = newest_complete(self.dirpath, checksum=self.checksum, prefix=self.resume_prefix)
        for checkpoint, reason in skipped:
            rank_zero_warn(f"ResumableCheckpoint: not resuming from {checkpoint}: {reason}")
        if found is None:
            rank_zero_info(f"ResumableCheckpoint: no complete resume set in {self.dirpath} yet; starting from the "
                           "beginning (best-k sets are not resumed: pass one as ckpt_path to resume from it).")
        self.resume_candidates = {str(found.checkpoint)} if found is not None else set()
        return self.resume_candidates


def _step_of(path: str) -> int:
    match = _STEP.search(Path(path).name)
    return int(match.group(1)) if match else -1

