"""Language-model data over any text files; by default the Python standard library's own sources,
which every Python installation ships (an offline corpus of a few tens of MB)."""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset


def stdlib_sources(limit: int | None = None) -> list[Path]:
    """The standard library's ``*.py`` files (tests and site-packages left out), sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py")
                   if "site-packages" not in p.parts and "test" not in p.parts and "tests" not in p.parts)
    return files[:limit] if limit else files


class _Blocks(Dataset):
    """Consecutive non-overlapping windows: ``x = ids[i:i+T]``, ``y = ids[i+1:i+T+1]``."""

    def __init__(self, ids: torch.Tensor, block_size: int) -> None:
        self.ids, self.block_size = ids, block_size

    def __len__(self) -> int:
        return max(0, (self.ids.numel() - 1) // self.block_size)

    def __getitem__(self, i: int):
        start = i * self.block_size
        chunk = self.ids[start:start + self.block_size + 1]
        return chunk[:-1], chunk[1:]


class TextDataModule(pl.LightningDataModule):
    """Next-token prediction over text files, byte- or character-level.

    Args:
        files: text files or directories (searched for ``*.txt``/``*.py``/``*.md``); default: the
            Python standard library's sources (:func:`stdlib_sources`).
        level: ``"byte"`` (vocabulary 256, default) or ``"char"`` (the corpus's characters).
        block_size: tokens per sample (default 128).
        batch_size: samples per batch and rank (default 16).
        val_fraction: share of the token stream held out, taken from its end (default 0.05): the
            split is deterministic and no window straddles it.
        max_files: read at most this many files (default all).

    Batches are ``(x, y)`` of shape ``[B, block_size]`` (long), ``y`` shifted by one token.
    """

    def __init__(self, files: list[str] | None = None, level: str = "byte", block_size: int = 128,
                 batch_size: int = 16, val_fraction: float = 0.05, max_files: int | None = None,
                 num_workers: int = 0) -> None:
        super().__init__()
        if level not in ("byte", "char"):
            raise ValueError(f"level must be 'byte' or 'char', got {level!r}.")
        if not 0 < val_fraction < 1:
            raise ValueError(f"val_fraction must lie in (0, 1), got {val_fraction}.")
        self.files, self.level, self.block_size = files, level, block_size
        self.batch_size, self.val_fraction, self.max_files, self.num_workers = batch_size, val_fraction, max_files, num_workers
        self.vocab: list[str] | None = None
        self.vocab_size: int | None = 256 if level == "byte" else None
        self.train_ids: torch.Tensor | None = None
        self.val_ids: torch.Tensor | None = None

    def _paths(self) -> list[Path]:
        if not self.files:
            return stdlib_sources(self.max_files)
        paths: list[Path] = []
        for entry in self.files:
            p = Path(entry)
            if p.is_dir():
                paths += sorted(q for q in p.rglob("*") if q.suffix in (".txt", ".py", ".md") and q.is_file())
            elif p.is_file():
                paths.append(p)
            else:
                raise FileNotFoundError(f"text source {entry!r} is neither a file nor a directory.")
        return paths[: self.max_files] if self.max_files else paths

    def setup(self, stage: str | None = None) -> None:
        if self.train_ids is not None:
            return
        paths = self._paths()
        if not paths:
            raise ValueError("no text files found; pass files=[...] with .txt/.py/.md files or directories.")
        raw = b"\n".join(p.read_bytes() for p in paths)
        if self.level == "byte":
            ids = torch.frombuffer(bytearray(raw), dtype=torch.uint8).long()
        else:
            text = raw.decode("utf-8", errors="replace")
            self.vocab = sorted(set(text))
            self.vocab_size = len(self.vocab)
            index = {c: i for i, c in enumerate(self.vocab)}
            ids = torch.tensor([index[c] for c in text], dtype=torch.long)
        cut = int(ids.numel() * (1 - self.val_fraction))
        if cut <= self.block_size or ids.numel() - cut <= self.block_size:
            raise ValueError(f"the corpus ({ids.numel()} tokens) is too small for block_size={self.block_size}.")
        self.train_ids, self.val_ids = ids[:cut], ids[cut:]

    def decode(self, ids: torch.Tensor) -> str:
        """Tokens back to text."""
        if self.level == "byte":
            return bytes(ids.tolist()).decode("utf-8", errors="replace")
        return "".join(self.vocab[i] for i in ids.tolist())

    def train_dataloader(self) -> DataLoader:
        return DataLoader(_Blocks(self.train_ids, self.block_size), batch_size=self.batch_size, shuffle=True,
                          num_workers=self.num_workers, drop_last=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(_Blocks(self.val_ids, self.block_size), batch_size=self.batch_size,
                          num_workers=self.num_workers, drop_last=True)
