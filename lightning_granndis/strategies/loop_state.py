"""Checkpoints taken as an epoch ends resume at the next epoch's start; what else a resumed run
needs from its checkpoint that Lightning's does not keep.

Lightning 2.6 resumes a checkpoint saved after an epoch's last batch (``every_n_train_steps``
landing on it) or in ``on_train_epoch_end`` as "restarted mid-epoch" / "restarted on epoch end".
With ``max_steps`` set it then runs the *next* epoch as the continuation of the restored one: that
epoch is never counted as started and its ``on_train_epoch_start`` hooks do not run, and an
epoch-end checkpoint even replays a batch. A checkpoint the resumed run saves later records one
epoch too few, so the run resumed from *it* shuffles with the wrong epoch's order; every resume
after the first drifts from the uninterrupted run.

:func:`settle_epoch_end` rewrites such a checkpoint's loop state, before Lightning reads it, into
the state of the next epoch's start (every finished epoch counted, no batch of the next one
begun), which Lightning resumes like an uninterrupted run: it counts and starts the epoch, runs its
hooks and gives the sampler the right epoch. Mid-epoch checkpoints are left as they are.
"""

from __future__ import annotations

from typing import Any

import torch

_COUNTERS = ("ready", "started", "processed", "completed")


def _at_epoch_end(epochs: dict, batches: dict) -> str | None:
    """``"batch_end"`` (saved in the last batch's ``on_train_batch_end``), ``"epoch_end"`` (saved
    in ``on_train_epoch_end``) or ``None`` (anywhere else)."""
    if not batches.get("is_last_batch"):
        return None
    batch, epoch = batches["current"], epochs["total"]
    if batch["ready"] == 0 or batch["processed"] != batch["ready"]:
        return None
    if batch["completed"] == batch["processed"] - 1 and epoch["processed"] == epoch["started"] - 1:
        return "batch_end"
    if (batch["completed"] == batch["processed"] and epoch["processed"] == epoch["started"]
            and epoch["completed"] == epoch["processed"] - 1):
        return "epoch_end"
    return None


def settle_epoch_end(checkpoint: dict[str, Any]) -> bool:
    """Rewrites, in place, the fit loop's state of a checkpoint saved as an epoch ended into the
    next epoch's start; returns whether it did."""
    fit = (checkpoint.get("loops") or {}).get("fit_loop")
    if not isinstance(fit, dict):
        return False
    epochs, batches = fit.get("epoch_progress"), fit.get("epoch_loop.batch_progress")
    if not isinstance(epochs, dict) or not isinstance(batches, dict):
        return False
    where = _at_epoch_end(epochs, batches)
    if where is None:
        return False
    for scope in ("total", "current"):  # the epoch that just ended is finished: every counter at it
        epochs[scope].update(dict.fromkeys(_COUNTERS, epochs[scope]["started"]))
    batches["total"]["completed"] = batches["total"]["processed"]
    batches["current"] = dict.fromkeys(_COUNTERS, 0)
    batches["is_last_batch"] = False
    if where == "batch_end":  # Lightning counts the last batch's optimizer step only after the hook
        loop_state = fit.setdefault("epoch_loop.state_dict", {})
        loop_state["_batches_that_stepped"] = loop_state.get("_batches_that_stepped", 0) + 1
    return True


def settle_epoch_start(checkpoint: dict[str, Any]) -> None:
    """Rewrites, in place, the fit loop's state of a checkpoint taken once an epoch is wholly over
    (at the next epoch's start, before its hooks, or as training ends) into that of the next epoch's
    start: every finished epoch counted, no batch of the next one begun."""
    fit = (checkpoint.get("loops") or {}).get("fit_loop")
    if not isinstance(fit, dict):
        return
    epochs, batches = fit.get("epoch_progress"), fit.get("epoch_loop.batch_progress")
    if not isinstance(epochs, dict) or not isinstance(batches, dict):
        return
    for scope in ("total", "current"):  # the next epoch is made ready at its start, not yet begun
        epochs[scope].update(dict.fromkeys(_COUNTERS, epochs[scope]["completed"]))
    batches["total"]["completed"] = batches["total"]["processed"]
    batches["current"] = dict.fromkeys(_COUNTERS, 0)
    batches["is_last_batch"] = False


def unsaved_trainer_state(trainer: Any) -> dict[str, Any]:
    """What the trainer holds that its checkpoint does not: the metrics callbacks last saw
    (``EarlyStopping`` and ``ModelCheckpoint`` compare against them) and whether it was told to
    stop. Tensors and plain values (loadable weights-only)."""
    metrics = {key: value.detach().cpu().clone() if isinstance(value, torch.Tensor) else torch.tensor(float(value))
               for key, value in trainer.callback_metrics.items()}
    return {"callback_metrics": metrics, "should_stop": bool(trainer.should_stop)}


def restore_unsaved_trainer_state(trainer: Any, state: dict[str, Any]) -> None:
    device = trainer.strategy.root_device
    trainer._logger_connector._callback_metrics.update(
        {key: value.to(device) for key, value in state.get("callback_metrics", {}).items()})
    trainer.should_stop = trainer.should_stop or bool(state.get("should_stop", False))
