"""Checkpoint I/O that writes atomically and loads with ``weights_only=True``."""

from __future__ import annotations

import pickle
import re
from typing import Any, Callable, Optional

from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.fabric.utilities.types import _PATH
from typing_extensions import override


class SafeCheckpointIO(TorchCheckpointIO):
    """Lightning's :class:`TorchCheckpointIO` (atomic writes through an fsspec transaction), but
    loading with ``weights_only=True`` unless told otherwise, so a checkpoint never runs code.

    A checkpoint that holds arbitrary Python objects is refused with an error that says how to
    load it anyway, if the user trusts its source.
    """

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
