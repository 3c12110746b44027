"""Checkpoint I/O that writes atomically and loads with ``weights_only=True``."""

from __future__ import annotations

import pickle
from typing import Any, Callable, Optional

from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.fabric.utilities.cloud_io import _is_local_file_protocol
from lightning.fabric.utilities.types import _PATH
from typing_extensions import override

from lightning_granndis.atomic import atomic_torch_save, weights_only_error


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
        atomic_torch_save(checkpoint, path)

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
            raise weights_only_error(path, err) from err
