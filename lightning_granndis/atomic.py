"""Safe files: atomic writes (a reader sees the old file or the new one, never half of either)
and weights-only loads (a file never runs code when loaded)."""

from __future__ import annotations

import os
import pickle
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import torch


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> None:
    """Writes through ``write(file)`` into a temporary file beside ``path``, flushes it to disk and
    renames it over ``path`` (``os.replace``: atomic on POSIX, same file system by construction)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_torch_save(obj, path: str | os.PathLike) -> None:
    atomic_write(path, lambda f: torch.save(obj, f))


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write(path, lambda f: f.write(text.encode()))


def weights_only_error(path, error: pickle.UnpicklingError) -> RuntimeError:
    """The error for a file a weights-only load refused: names the object and the way out."""
    found = re.search(r"Unsupported global: GLOBAL (\S+)", str(error))
    what = f" (it holds {found.group(1)})" if found else ""
    return RuntimeError(
        f"Checkpoint {path} holds Python objects that a weights-only load refuses{what}. "
        "Keep only tensors and plain containers in `on_save_checkpoint`/hyperparameters, or, if you "
        "trust the file, load it with `trainer.fit(..., weights_only=False)`.")


def load_weights_only(path: str | os.PathLike, map_location="cpu"):
    """``torch.load(path, weights_only=True)``, with :func:`weights_only_error` on refusal."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        raise weights_only_error(path, error) from error
