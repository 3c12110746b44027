"""Checkpoint I/O that writes atomically and loads with ``weights_only=True``."""

from __future__ import annotations

import os
import pickle
import re
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.fabric.utilities.cloud_io import _is_local_file_protocol
from lightning.fabric.utilities.types import _PATH
from typing_extensions import override


class SafeCheckpointIO(TorchCheckpointIO):
    """Checkpoints that are never half-written and never run code when loaded.

    Saving to a local path writes a temporary file in the target's own directory, flushes it to
    disk and renames it over the target (``os.replace``, atomic on POSIX): a crash leaves either
    the old checkpoint or the new one. (Lightning's default moves a file from the system temp
    directory, which is a copy when that is another file system.) Remote paths go through
    Lightning's fsspec transaction.

    Loading uses ``weights_only=True`` unless told otherwise. A checkpoint that holds arbitrary
    Python objects is refused with an error naming the object and saying how to load it anyway,
    if the user trusts its source.
    """

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Optional[Any] = None) -> None:
        if not _is_local_file_protocol(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    @override
    def load_checkpoint(
        self,
        path: _PATH,
        map_location: Optional[Callable] = lambda storage, loc: storage,
        weights_only: Optional[bool] = True,
    ) -> dict[str, Any]:
        try:
            return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)
        except pickle.UnpicklingError as err:
            found = re.search(r"Unsupported global: GLOBAL (\S+)", str(err))
            what = f" (it holds {found.group(1)})" if found else ""
            raise RuntimeError(
                f"Checkpoint {path} holds Python objects that a weights-only load refuses{what}. "
                "Keep only tensors and plain containers in `on_save_checkpoint`/hyperparameters, or, if you "
                "trust the file, load it with `trainer.fit(..., weights_only=False)`."
            ) from err
