"""One state dict from a pipeline checkpoint's per-stage shards, for single-device use."""

from __future__ import annotations

from pathlib import Path

import torch

from lightning_granndis.atomic import atomic_torch_save, load_weights_only


def shard_path(filepath, stage: int) -> Path:
    """Stage 0's shard is ``filepath`` itself (it also holds the loops' state); stage ``s`` writes
    ``filepath.stage{s}`` beside it."""
    path = Path(filepath)
    return path if stage == 0 else path.with_name(f"{path.name}.stage{stage}")


def resumed_balance(filepath, stages: int) -> list[int] | None:
    """The blocks per stage recorded in a pipeline checkpoint of ``stages`` stages, or ``None``
    when it has none (not a pipeline checkpoint, unreadable, another stage count: the load that
    follows names the problem). Memory-mapped: only the small metadata entry is read."""
    try:
        meta = torch.load(shard_path(filepath, 0), map_location="cpu", weights_only=True, mmap=True).get("pipeline")
    except Exception:  # noqa: BLE001 - the checkpoint's own verification reports it
        return None
    balance = meta.get("balance") if isinstance(meta, dict) else None
    return [int(b) for b in balance] if isinstance(balance, list) and len(balance) == stages else None


def consolidate_checkpoint(filepath, output=None) -> dict[str, torch.Tensor]:
    """Merges the stage shards of a :class:`~lightning_granndis.strategies.CompressedPipelineStrategy`
    checkpoint into the whole model's ``state_dict``.

    Args:
        filepath: the checkpoint path the trainer was given (stage 0's shard).
        output: when given, also write ``{"state_dict": ..., "pipeline": ...}`` there (atomically).

    Returns:
        The state dict, loadable with ``module.load_state_dict(..., strict=True)`` into a fresh
        (unsplit) module of the same configuration; tied parameters appear under every name.
    """
    first = load_weights_only(shard_path(filepath, 0))
    meta = first.get("pipeline")
    if meta is None:
        raise ValueError(f"{filepath} is not a pipeline checkpoint (no 'pipeline' entry): it is already whole.")
    state = dict(first["state_dict"])
    for stage in range(1, meta["stages"]):
        path = shard_path(filepath, stage)
        if not path.exists():
            raise FileNotFoundError(f"{path}: the shard of stage {stage} of {meta['stages']} is missing.")
        shard = load_weights_only(path)
        if shard.get("pipeline", {}).get("balance") != meta["balance"]:
            raise ValueError(f"{path} belongs to another pipeline configuration than {filepath}.")
        state.update(shard["state_dict"])
    if output is not None:
        atomic_torch_save({"state_dict": state, "pipeline": {**meta, "consolidated": True}}, output)
    return state
