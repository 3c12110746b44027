"""The graph store on disk: a manifest and one shard file per server, committed as a set.

Layout of a store directory::

    manifest.json              format version, generation, graph fingerprint, every parameter,
                               per-shard sizes and SHA-256 checksums (written last)
    server<s>.<generation>.pt  server s: its devices' training and evaluation parts, its sampling
                               source (a flat dict of tensors, loaded weights-only and mmap'd)
    structure.<generation>.pt  MB_base only: the whole graph's structure (SALIENT++ keeps it on
                               every device), shared by all ranks

Shards are written first, the manifest last (each atomically), and shards carry the generation
in their names, so a partitioning step killed half-way leaves the previous store intact; the
previous generation's shards are removed only after the new manifest is in place.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import fields
from pathlib import Path

import torch

from lightning_granndis.atomic import atomic_torch_save, atomic_write_text
from lightning_granndis.graph.one_hop import OneHopGraph
from lightning_granndis.graph.sampling import CSRGraph
from lightning_granndis.graph.store.shards import SPLITS, GraphPart, RankShard, SamplingSource

FORMAT = "lightning_granndis.graph_store"
VERSION = 1
MANIFEST = "manifest.json"
_GRAPH_TENSORS = ("n_id", "edge_index", "send_index", "hop", "seed")
_SOURCE_TENSORS = ("n_id", "seeds", "owner", "x", "y", "degree", "inner")


class GraphStoreError(ValueError):
    """A store that cannot be used as it is: missing, truncated, stale or made for another run."""


def fix_hint(manifest: dict | None) -> str:
    command = (manifest or {}).get("command")
    return f"re-run `{command}`" if command else "re-run `granndis partition ...` for this configuration"


# ---------------------------------------------------------------------- (de)serialising
def _put_part(out: dict, prefix: str, part: GraphPart) -> None:
    g = part.graph
    for name in _GRAPH_TENSORS:
        out[f"{prefix}/{name}"] = getattr(g, name)
    out[f"{prefix}/n_owned"] = torch.tensor(g.n_owned)
    out[f"{prefix}/send_splits"] = torch.tensor(g.send_splits, dtype=torch.long)
    out[f"{prefix}/recv_splits"] = torch.tensor(g.recv_splits, dtype=torch.long)
    out[f"{prefix}/exact_hops"] = torch.tensor(-1 if g.exact_hops is None else g.exact_hops)
    out[f"{prefix}/iteration"] = torch.tensor(int(g.meta.get("iteration", 0)))
    out[f"{prefix}/x"], out[f"{prefix}/y"], out[f"{prefix}/degree"] = part.x, part.y, part.degree
    out[f"{prefix}/weight"] = torch.tensor(float(part.weight), dtype=torch.double)
    for split, mask in part.masks.items():
        out[f"{prefix}/{split}"] = mask


def _get_part(blob: dict, prefix: str, **meta) -> GraphPart:
    exact = int(blob[f"{prefix}/exact_hops"])
    graph = OneHopGraph(
        n_owned=int(blob[f"{prefix}/n_owned"]), send_splits=blob[f"{prefix}/send_splits"].tolist(),
        recv_splits=blob[f"{prefix}/recv_splits"].tolist(), exact_hops=None if exact < 0 else exact,
        meta={**meta, "iteration": int(blob[f"{prefix}/iteration"])},
        **{name: blob[f"{prefix}/{name}"] for name in _GRAPH_TENSORS},
    )
    masks = {s: blob[f"{prefix}/{s}"] for s in SPLITS if f"{prefix}/{s}" in blob}
    return GraphPart(graph, blob[f"{prefix}/x"], blob[f"{prefix}/y"], masks, blob[f"{prefix}/degree"],
                     float(blob[f"{prefix}/weight"]))


def _put_source(out: dict, prefix: str, source: SamplingSource, with_features: bool = True) -> None:
    out[f"{prefix}/rowptr"], out[f"{prefix}/col"] = source.csr.rowptr, source.csr.col
    for name in _SOURCE_TENSORS:
        value = getattr(source, name)
        if value is not None and (with_features or name != "x"):
            out[f"{prefix}/{name}"] = value
    out[f"{prefix}/seed_counts"] = torch.tensor(source.seed_counts, dtype=torch.long)
    out[f"{prefix}/iterations"] = torch.tensor(source.iterations)


def _get_source(blob: dict, prefix: str, x: torch.Tensor | None = None, x_row: torch.Tensor | None = None) -> SamplingSource:
    rowptr = blob[f"{prefix}/rowptr"]
    values = {name: blob.get(f"{prefix}/{name}") for name in _SOURCE_TENSORS}
    if x is not None:
        values["x"] = x
    return SamplingSource(CSRGraph(rowptr, blob[f"{prefix}/col"], int(rowptr.numel()) - 1),
                          seed_counts=blob[f"{prefix}/seed_counts"].tolist(),
                          iterations=int(blob[f"{prefix}/iterations"]), x_row=x_row, **values)


def shard_blob(shards: list[RankShard], mode: str) -> dict[str, torch.Tensor]:
    """One server's shard file content: a flat dict of tensors (loadable weights-only, mmap'd)."""
    out: dict[str, torch.Tensor] = {}
    for shard in shards:
        d = shard.device
        if mode != "full":  # FB_base trains on its evaluation part
            for i, part in enumerate(shard.train):
                _put_part(out, f"train/{d}/{i}", part)
        _put_part(out, f"eval/{d}", shard.eval)
    source = shards[0].source
    if source is not None and mode != "minibatch":
        _put_source(out, "source", source)
    return out


def structure_blob(source: SamplingSource) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    _put_source(out, "structure", source, with_features=False)
    return out


# ---------------------------------------------------------------------- files
def sha256(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def write_file(directory: Path, name: str, blob: dict) -> dict:
    path = directory / name
    atomic_torch_save(blob, path)
    return {"file": name, "bytes": path.stat().st_size, "sha256": sha256(path)}


def commit_manifest(directory: Path, manifest: dict) -> None:
    """Writes the manifest (atomically, last), then removes shards of other generations."""
    atomic_write_text(directory / MANIFEST, json.dumps(manifest, indent=1))
    keep = {entry["file"] for entry in manifest["shards"]} | ({manifest["structure"]["file"]}
                                                             if manifest.get("structure") else set())
    for path in directory.glob("*.pt"):
        if path.name not in keep and (path.name.startswith("server") or path.name.startswith("structure")):
            path.unlink(missing_ok=True)


def read_manifest(directory: str | os.PathLike) -> dict:
    path = Path(directory) / MANIFEST
    if not path.exists():
        raise GraphStoreError(f"{path} is missing: {directory} is not a (complete) graph store. Write one with "
                              "`granndis partition --dataset NAME --servers S --devices G --mode MODE --out "
                              f"{directory}`.")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise GraphStoreError(f"{path} is not valid JSON ({error}); re-run `granndis partition ...`.") from error
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise GraphStoreError(f"{path} is format {manifest.get('format')!r} version {manifest.get('version')!r}; "
                              f"this version reads {FORMAT!r} version {VERSION}: {fix_hint(manifest)}.")
    return manifest


def check_params(manifest: dict, expected: dict, directory) -> None:
    """Refuses a store made for another configuration, naming every difference."""
    made = manifest["params"]
    diffs = [f"{key}={made.get(key)!r} in the store, {value!r} here" for key, value in expected.items()
             if made.get(key) != value]
    if diffs:
        raise GraphStoreError(f"the graph store {directory} was partitioned for another configuration: "
                              f"{'; '.join(diffs)}. {fix_hint(manifest).capitalize()} with this run's "
                              "settings, or use the settings the store was made with.")


def _verified(directory: Path, entry: dict, manifest: dict, checksum: bool) -> Path:
    path = directory / entry["file"]
    if not path.exists():
        raise GraphStoreError(f"{path} is missing from the graph store (its manifest lists it): {fix_hint(manifest)}.")
    size = path.stat().st_size
    if size != entry["bytes"]:
        raise GraphStoreError(f"{path} is {size:,} bytes but the manifest says {entry['bytes']:,} (truncated or "
                              f"overwritten): {fix_hint(manifest)}.")
    if checksum and sha256(path) != entry["sha256"]:
        raise GraphStoreError(f"{path} does not match its SHA-256 in the manifest (corrupt or from another "
                              f"partitioning run): {fix_hint(manifest)}.")
    return path


def _load(path: Path, manifest: dict) -> dict:
    try:
        return torch.load(path, mmap=True, weights_only=True)
    except Exception as error:  # a file that passed the size check but does not parse
        raise GraphStoreError(f"{path} cannot be read ({error}): {fix_hint(manifest)}.") from error


def load_rank_shard(directory: str | os.PathLike, rank: int, world_size: int, expected: dict | None = None,
                    checksum: bool = True) -> RankShard:
    """Rank ``rank``'s shard: memory-maps only its server's file (and MB_base's shared structure);
    only the pages of its own device's rows are read.

    Args:
        directory: the store.
        rank, world_size: this process and the run's size (must be ``servers * devices``).
        expected: parameters this run needs; any difference is refused, named.
        checksum: verify the files' SHA-256 (reads them once; sizes are always checked).
    """
    directory = Path(directory)
    manifest = read_manifest(directory)
    params = manifest["params"]
    S, G = params["servers"], params["devices_per_server"]
    if S * G != world_size:
        raise GraphStoreError(f"the graph store {directory} was partitioned for {S} servers x {G} devices = {S * G} "
                              f"ranks, but this run has {world_size}: {fix_hint(manifest)} with --servers and "
                              "--devices matching the launch.")
    check_params(manifest, expected or {}, directory)
    server, device = divmod(rank, G)
    blob = _load(_verified(directory, manifest["shards"][server], manifest, checksum), manifest)
    mode = params["mode"]
    eval_part = _get_part(blob, f"eval/{device}", scope="world", purpose="eval", server=server)
    if mode == "full":
        train = [GraphPart(**{**eval_part.__dict__, "weight": manifest["full_weights"][rank]})]
        train[0].graph = OneHopGraph(**{f.name: getattr(eval_part.graph, f.name) for f in fields(OneHopGraph)
                                        if f.name != "meta"}, meta={"scope": "world", "purpose": "halo"})
    else:
        count = sum(1 for key in blob if key.startswith(f"train/{device}/") and key.endswith("/n_owned"))
        train = [_get_part(blob, f"train/{device}/{i}", scope="intra", purpose="halo", server=server)
                 for i in range(count)]
    source = None
    if "source/rowptr" in blob:
        source = _get_source(blob, "source")
    elif mode == "minibatch":
        structure = _load(_verified(directory, manifest["structure"], manifest, checksum), manifest)
        owned = eval_part.graph.n_owned
        owner = structure["structure/owner"]
        mine = owner == rank
        x_row = torch.where(mine, torch.cumsum(mine, 0) - 1, torch.full_like(owner, -1))
        source = _get_source(structure, "structure", x=eval_part.x[:owned], x_row=x_row)
    return RankShard(rank, server, device, train, eval_part, source, meta={"manifest": manifest})


class GraphStoreHandle:
    """What a store-backed datamodule's loaders yield instead of the graph: where the store is and
    its manifest. A GNN strategy loads each rank's own shard from it."""

    def __init__(self, directory: str | os.PathLike, manifest: dict | None = None) -> None:
        self.directory = Path(directory)
        self.manifest = manifest if manifest is not None else read_manifest(directory)

    @property
    def num_nodes(self) -> int:
        return int(self.manifest["num_nodes"])

    def __repr__(self) -> str:
        p = self.manifest["params"]
        return (f"GraphStoreHandle({str(self.directory)!r}, mode={p['mode']!r}, servers={p['servers']}, "
                f"devices_per_server={p['devices_per_server']})")
