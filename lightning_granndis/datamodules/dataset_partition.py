"""The offline step from a dataset's name: load an :class:`OGBNodeDataModule` graph once and
partition it into a graph store (``granndis partition``). Above both the OGB loader and the store's
DataModule, so neither needs the other's module for it."""

from __future__ import annotations

import os
import shlex

from lightning_granndis.datamodules.graph_store import source_info
from lightning_granndis.datamodules.ogb import OGBNodeDataModule
from lightning_granndis.graph.store import partition_graph


def partition_dataset(dataset: str, out: str | os.PathLike, mode: str, servers: int, devices: int, hops: int = 3,
                      root: str = "data", seed: int = 0, command: str | None = None, **params) -> dict:
    """Loads ``dataset`` (any :class:`OGBNodeDataModule` name) once and partitions it into a store
    at ``out`` for ``servers`` x ``devices`` ranks (see
    :func:`~lightning_granndis.graph.store.partition_graph` for ``mode`` and ``params``)."""
    dm = OGBNodeDataModule(dataset, root=root)
    dm.prepare_data()
    dm.setup()
    if command is None:
        extra = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in params.items() if v is not None)
        command = (f"granndis partition --dataset {dataset} --root {shlex.quote(str(root))} --servers {servers} "
                   f"--devices {devices} --mode {mode} --hops {hops} --out {shlex.quote(str(out))}"
                   + (f" --seed {seed}" if seed else "") + (f" {extra}" if extra else ""))
    return partition_graph(dm.data, out, mode, servers, devices, hops, dataset=dataset,
                           source=source_info(dm.processed_file()), command=command,
                           num_classes=dm.num_classes, seed=seed, **params)
