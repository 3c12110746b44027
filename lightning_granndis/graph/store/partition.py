"""The offline partitioning step: the whole graph once, METIS once, one shard per server.

Like DistDGL's ``partition_graph``, this is the one place that holds the whole graph (its peak
memory is recorded in the manifest); the shards are built and written one server at a time, so
only one server's shard is in memory beside the graph.
"""

from __future__ import annotations

import hashlib
import os
import resource
import secrets
import time
from pathlib import Path

import torch

from lightning_granndis.graph.fanouts import Fanout, resolve_fanouts
from lightning_granndis.graph.plan import PlanConfig
from lightning_granndis.graph.store.files import FORMAT, VERSION, commit_manifest, shard_blob, structure_blob, write_file
from lightning_granndis.graph.store.shards import MODES, build_shards
from lightning_granndis.graph.validation import validate_graph

#: the parameters each mode's shards depend on (beyond mode, servers, devices and seed)
_RELEVANT = {
    "flx": ("hops",),
    "eas": ("eas_hops", "fanout", "eas_sampling", "resample"),
    # a sampled mode's shard is its sampling source (the closure, the split): fan-outs and batch
    # sizes are read at run time, so one store serves any of them
    "cob": ("hops",),
    "full": (),
    "minibatch": ("hops",),
}


def store_params(mode: str, servers: int, devices_per_server: int, hops: int, fanout: Fanout | None = None,
                 eas_hops: int = 1, eas_sampling: str = "degree", batch_size: int = 1024,
                 iterations: int | None = None, seed: int = 0, resample: str = "once") -> dict:
    """The parameters a store is made for, normalised: those ``mode`` does not read are left out,
    so a store is refused only for a difference that changes its shards."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r} for a graph store; choose one of {', '.join(MODES)}.")
    eas_fanout = None
    if mode == "eas":
        eas_fanouts = resolve_fanouts(fanout, eas_hops, 15, "eas fanout", "the expansion's hops (eas_hops)")
        # one int where every hop is the same (what stores written before per-hop fan-outs hold)
        eas_fanout = eas_fanouts[0] if len(set(eas_fanouts)) == 1 else eas_fanouts
    values = dict(hops=hops, fanout=eas_fanout, eas_hops=eas_hops,
                  eas_sampling=eas_sampling, batch_size=batch_size, iterations=iterations, resample=resample)
    return {"mode": mode, "servers": servers, "devices_per_server": devices_per_server, "seed": seed,
            **{key: values[key] for key in _RELEVANT[mode]}}


def fingerprint(data) -> str:
    """BLAKE2b of the graph's vertex count, edges, features, labels and splits."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(str(int(data.num_nodes)).encode())
    for key in ("edge_index", "x", "y", "train_mask", "val_mask", "test_mask"):
        value = getattr(data, key, None)
        if value is not None:
            digest.update(key.encode())
            for chunk in value.contiguous().reshape(-1).split(2**24):  # streamed: no copy of the whole tensor
                digest.update(chunk.numpy().tobytes())
    return digest.hexdigest()


def partition_graph(data, out: str | os.PathLike, mode: str, servers: int, devices_per_server: int, hops: int,
                    fanout: Fanout | None = None, eas_hops: int = 1, eas_sampling: str = "degree",
                    batch_size: int = 1024, iterations: int | None = None, seed: int = 0, resample: str = "once",
                    dataset: str | None = None, source: dict | None = None, command: str | None = None,
                    num_classes: int | None = None, progress: bool = True, cache_dir: str | None = None) -> dict:
    """Partitions ``data`` (a PyG ``Data`` with ``x``, ``edge_index``, ``y``, ``train_mask``) for
    ``servers`` x ``devices_per_server`` ranks and writes a graph store to ``out``.

    Args:
        mode: ``flx``, ``eas``, ``cob`` (GraNNDis), ``full`` (FB_base) or ``minibatch`` (MB_base).
        hops: the model's message-passing layers ``L``.
        fanout, eas_hops, eas_sampling, batch_size, iterations, seed, resample: as the strategies.
        dataset, source: recorded in the manifest (the datamodule checks them at run time).
        command: the command line that rebuilds this store (quoted in every error's fix).
        cache_dir: where METIS assignments are cached (a graph's stores for several modes share one).

    Returns:
        The manifest (also in ``out/manifest.json``).
    """
    params = store_params(mode, servers, devices_per_server, hops, fanout, eas_hops, eas_sampling, batch_size,
                          iterations, seed, resample)
    validate_graph(data, num_classes, name=dataset or "the graph")
    t0 = time.perf_counter()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    generation = secrets.token_hex(4)
    cfg = PlanConfig(mode=mode, servers=servers, devices_per_server=devices_per_server,
                     hops=hops, fanout=params.get("fanout"), eas_hops=eas_hops, weighted=eas_sampling == "degree",
                     batch_size=batch_size, iterations=iterations, seed=seed, resample=resample,
                     cache_dir=cache_dir)
    shards_meta, structure, full_weights = [], None, []
    for server_shards in build_shards(data, cfg, progress=progress):
        s = server_shards[0].server
        entry = write_file(out, f"server{s}.{generation}.pt", shard_blob(server_shards, mode))
        entry.update(server=s, vertices=[sh.eval.graph.n_owned for sh in server_shards],
                     train_vertices=[sum(int(p.graph.n_id.numel()) for p in sh.train) for sh in server_shards],
                     train_edges=[sum(int(p.graph.edge_index.shape[1]) for p in sh.train) for sh in server_shards])
        if server_shards[0].source is not None and mode != "minibatch":
            entry["source_vertices"] = int(server_shards[0].source.n_id.numel())
            entry["source_edges"] = int(server_shards[0].source.csr.col.numel())
        shards_meta.append(entry)
        full_weights += [sh.train[0].weight if sh.train else 1.0 for sh in server_shards]
        if mode == "minibatch" and structure is None:
            structure = write_file(out, f"structure.{generation}.pt", structure_blob(server_shards[0].source))
        del server_shards  # written: dropped before the next server's are built
    manifest = {
        "format": FORMAT, "version": VERSION, "generation": generation, "dataset": dataset, "source": source,
        "fingerprint": fingerprint(data), "params": params, "num_nodes": int(data.num_nodes),
        "num_edges": int(data.edge_index.shape[1]), "num_features": int(data.x.shape[1]),
        "num_classes": int(num_classes if num_classes is not None else int(data.y.max()) + 1),
        "shards": shards_meta, "structure": structure, "full_weights": full_weights, "command": command,
        "partition_seconds": round(time.perf_counter() - t0, 2),
        "partition_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    commit_manifest(out, manifest)
    return manifest
