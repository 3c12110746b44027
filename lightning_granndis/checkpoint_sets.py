"""Checkpoints as sets of files committed together, and finding the newest complete one.

A checkpoint can be several files written by several ranks (a pipeline's per-stage shards). A
process killed between two of them leaves a set no run should load. So a set is *committed* by a
small manifest written last, atomically, after every file of the set is on disk::

    epoch=3-step=40.ckpt               the checkpoint (stage 0's shard for a pipeline)
    epoch=3-step=40.ckpt.stage1 ...    the other shards, if any
    epoch=3-step=40.ckpt.set.json      the commit: every file's name, bytes and SHA-256, the step

A set without its manifest was never committed; a file whose size or checksum differs from the
manifest is truncated, corrupt, or from another step (a mixed set). :func:`verify_set` names the
file and the reason; :func:`newest_complete` returns the newest set that verifies, with the
reasons the newer ones were skipped, so a resumed run never loads a broken checkpoint and falls
back to the previous complete one.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from lightning_granndis.atomic import atomic_write, atomic_write_text

SUFFIX = ".set.json"
FORMAT = "lightning_granndis.checkpoint_set"
#: An empty file a rank without a checkpoint resumes "from": it stands for the set a peer then
#: sends it (replica recovery), and is removed once that set is written.
RECEIVED_PLACEHOLDER = "received-from-peer.ckpt"


class CheckpointSetError(ValueError):
    """A checkpoint set that must not be loaded: uncommitted, incomplete, truncated, corrupt or
    mixed. The message names the file and what is wrong with it."""


def manifest_path(checkpoint: str | os.PathLike) -> Path:
    path = Path(checkpoint)
    return path.with_name(path.name + SUFFIX)


def sha256(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def commit_set(checkpoint: str | os.PathLike, files: list[str | os.PathLike], step: int, epoch: int,
               checksum: bool = True) -> Path:
    """Writes the manifest that commits ``files`` (all beside ``checkpoint``, already on disk) as
    one set, atomically. Call it once every file is written (after a barrier, on one rank)."""
    entries = []
    for file in files:
        path = Path(file)
        entries.append({"file": path.name, "bytes": path.stat().st_size,
                        "sha256": sha256(path) if checksum else None})
    manifest = {"format": FORMAT, "checkpoint": Path(checkpoint).name, "step": int(step), "epoch": int(epoch),
                "files": entries}
    target = manifest_path(checkpoint)
    atomic_write_text(target, json.dumps(manifest, indent=1))
    return target


def uncommit(checkpoint: str | os.PathLike) -> None:
    """Removes a set's manifest first: a set being deleted is never mistaken for a complete one."""
    manifest_path(checkpoint).unlink(missing_ok=True)


@dataclass
class CheckpointSet:
    checkpoint: Path
    step: int
    epoch: int
    files: list[Path]


def read_set(checkpoint: str | os.PathLike) -> tuple[CheckpointSet, dict]:
    """The set committed for ``checkpoint`` (not verified) and its manifest, or
    :class:`CheckpointSetError`."""
    checkpoint = Path(checkpoint)
    path = manifest_path(checkpoint)
    if not path.exists():
        raise CheckpointSetError(f"{checkpoint} has no commit record {path.name}: its set was never completed "
                                 "(the run stopped while writing it). Resume from an earlier checkpoint.")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise CheckpointSetError(f"{path} cannot be read ({error}): the set is not usable.") from error
    if manifest.get("format") != FORMAT:
        raise CheckpointSetError(f"{path} is not a checkpoint-set record (format {manifest.get('format')!r}).")
    return CheckpointSet(checkpoint, int(manifest["step"]), int(manifest["epoch"]),
                         [checkpoint.with_name(e["file"]) for e in manifest["files"]]), manifest


def verify_set(checkpoint: str | os.PathLike, checksum: bool = True) -> CheckpointSet:
    """The committed set of ``checkpoint`` with every file present, of its recorded size and (with
    ``checksum``) SHA-256; otherwise :class:`CheckpointSetError` naming the file."""
    found, manifest = read_set(checkpoint)
    for entry, path in zip(manifest["files"], found.files):
        if not path.exists():
            raise CheckpointSetError(f"{path} is missing from the checkpoint set of {found.checkpoint.name} "
                                     f"(step {found.step}): the set is incomplete.")
        size = path.stat().st_size
        if size != entry["bytes"]:
            raise CheckpointSetError(f"{path} is {size:,} bytes but its set records {entry['bytes']:,}: truncated "
                                     "or overwritten.")
        if checksum and entry.get("sha256") and sha256(path) != entry["sha256"]:
            raise CheckpointSetError(f"{path} does not match the SHA-256 its set records: corrupt, or a shard of "
                                     f"another step than {found.step} (a mixed set).")
    return found


def newest_complete(directory: str | os.PathLike, checksum: bool = True, prefix: str = ""
                    ) -> tuple[CheckpointSet | None, list[tuple[Path, str]]]:
    """The newest (highest step, then newest record) set in ``directory`` whose name starts with
    ``prefix`` that verifies, and the ``(checkpoint, reason)`` of every newer one skipped. ``None``
    when no set verifies."""
    directory = Path(directory)
    if not directory.is_dir():
        return None, []
    records = []
    for path in directory.glob(f"{prefix}*{SUFFIX}"):
        checkpoint = path.with_name(path.name[: -len(SUFFIX)])
        try:
            found, _ = read_set(checkpoint)
            records.append(((found.step, path.stat().st_mtime_ns), checkpoint))
        except CheckpointSetError as error:
            records.append(((-1, 0), checkpoint, str(error)))
    skipped: list[tuple[Path, str]] = []
    for record in sorted(records, key=lambda r: r[0], reverse=True):
        if len(record) == 3:
            skipped.append((record[1], record[2]))
            continue
        try:
            return verify_set(record[1], checksum), skipped
        except CheckpointSetError as error:
            skipped.append((record[1], str(error)))
    return None, skipped


def pack_set(checkpoint: str | os.PathLike, checksum: bool = True) -> dict[str, bytes]:
    """A verified set's files and its record, as ``{file name: bytes}``: to hand a set to a rank
    that has none (a replica's snapshot to a restarted server)."""
    found = verify_set(checkpoint, checksum=checksum)
    blobs = {path.name: path.read_bytes() for path in found.files}
    blobs[manifest_path(found.checkpoint).name] = manifest_path(found.checkpoint).read_bytes()
    return blobs


def unpack_set(directory: str | os.PathLike, blobs: dict[str, bytes]) -> Path:
    """Writes a set packed by :func:`pack_set` into ``directory``: its files first, each
    atomically, then its record (the commit). Returns the checkpoint's path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    record = next(name for name in blobs if name.endswith(SUFFIX))
    for name, data in blobs.items():
        if name != record:
            atomic_write(directory / name, lambda f, data=data: f.write(data))
    atomic_write(directory / record, lambda f: f.write(blobs[record]))
    return directory / record[: -len(SUFFIX)]
