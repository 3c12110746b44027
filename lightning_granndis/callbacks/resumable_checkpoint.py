"""Checkpoints a restarted run resumes from by itself: ``trainer.fit(..., ckpt_path="last")``."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_warn
from typing_extensions import override

from lightning_granndis.checkpoint_sets import newest_complete


class ResumableCheckpoint(ModelCheckpoint):
    """A :class:`~lightning.pytorch.callbacks.ModelCheckpoint` that saves every ``every_n_train_steps``
    steps (or epochs) under a fixed ``dirpath`` and keeps the ``keep`` newest, and that makes
    ``trainer.fit(model, ckpt_path="last")`` resume from the newest *complete* checkpoint there.

    Under ``torchrun --max-restarts=N`` every restarted worker runs the same script again; with
    ``ckpt_path="last"`` each finds the same newest checkpoint set whose commit record verifies
    (every file present, of the recorded size and SHA-256; see
    :mod:`~lightning_granndis.checkpoint_sets`, written by this suite's strategies), skips newer
    ones that are incomplete, truncated or corrupt with a warning naming the file, and resumes. A
    first run (nothing saved yet) starts from scratch. A killed worker costs at most the steps since
    the last checkpoint.

    Args:
        dirpath: where the checkpoints go (required: a restarted run must find the same folder,
            which Lightning's default, a new logger version per run, would not be).
        every_n_train_steps, every_n_epochs: how often to save (as ``ModelCheckpoint``).
        keep: newest checkpoints kept (default 2: if the newest is damaged, the one before it is
            still there to resume from).
        checksum: verify SHA-256 when choosing (default ``True``; sizes are always checked).
        **kwargs: passed on to ``ModelCheckpoint`` (``filename``, ...).
    """

    def __init__(self, dirpath: str, every_n_train_steps: int | None = None, every_n_epochs: int | None = None,
                 keep: int = 2, checksum: bool = True, **kwargs: Any) -> None:
        if not dirpath:
            raise ValueError("ResumableCheckpoint needs a dirpath: a restarted run must find its checkpoints in "
                             "the same folder (e.g. dirpath='runs/my_run/checkpoints').")
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}.")
        if every_n_train_steps is None and every_n_epochs is None:
            every_n_epochs = 1
        super().__init__(dirpath=dirpath, every_n_train_steps=every_n_train_steps, every_n_epochs=every_n_epochs,
                         save_top_k=keep, monitor="step", mode="max", **kwargs)
        self.checksum = checksum
        self.resume_candidates: set[str] | None = None  # what ckpt_path="last" found here (None: not asked)

    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(every_n_train_steps=self._every_n_train_steps,
                                        every_n_epochs=self._every_n_epochs, resumable=True)

    @override
    def _find_last_checkpoints(self, trainer: pl.Trainer) -> set[str]:
        found, skipped = newest_complete(self.dirpath, checksum=self.checksum)
        for checkpoint, reason in skipped:
            rank_zero_warn(f"ResumableCheckpoint: not resuming from {checkpoint}: {reason}")
        self.resume_candidates = {str(found.checkpoint)} if found is not None else set()
        return self.resume_candidates
