"""A partitioned graph as a DataModule: the loaders yield the store's handle, never the graph.

    granndis partition --dataset synthetic-products --servers 2 --devices 2 --mode eas --out stores/products_eas

(or :func:`~lightning_granndis.datamodules.dataset_partition.partition_dataset` /
:func:`~lightning_granndis.graph.store.partition_graph` from Python)
writes the store once; at run time each rank of a GNN strategy memory-maps only its own server's
shard, so no process holds the whole graph.
"""

from __future__ import annotations

import os
from pathlib import Path

import lightning.pytorch as pl
from torch.utils.data import DataLoader

from lightning_granndis.graph.store import GraphStoreError, GraphStoreHandle, read_manifest


class GraphStoreDataModule(pl.LightningDataModule):
    """A graph store (see :func:`~lightning_granndis.graph.store.partition_graph`) for the GNN
    strategies. ``num_features`` and ``num_classes`` come from its manifest.

    Args:
        store: the store directory.
        dataset: when given, the dataset name the store must have been made from.
    """

    def __init__(self, store: str | os.PathLike, dataset: str | None = None) -> None:
        super().__init__()
        self.store, self.dataset = Path(store), dataset
        self.handle: GraphStoreHandle | None = None
        self.num_features = self.num_classes = 0

    def setup(self, stage: str | None = None) -> None:
        if self.handle is not None:
            return
        manifest = read_manifest(self.store)
        if self.dataset is not None and manifest.get("dataset") not in (None, self.dataset):
            raise GraphStoreError(f"the graph store {self.store} holds {manifest['dataset']!r}, not {self.dataset!r}: "
                                  f"partition {self.dataset} into its own store (`granndis partition --dataset "
                                  f"{self.dataset} ...`) or point store= at the right one.")
        _check_source_unchanged(self.store, manifest)
        self.handle = GraphStoreHandle(self.store, manifest)
        self.num_features, self.num_classes = manifest["num_features"], manifest["num_classes"]

    def _loader(self) -> DataLoader:
        return DataLoader([self.handle], batch_size=None, collate_fn=lambda h: h)

    def train_dataloader(self) -> DataLoader:
        return self._loader()

    def val_dataloader(self) -> DataLoader:
        return self._loader()

    def test_dataloader(self) -> DataLoader:
        return self._loader()

    def predict_dataloader(self) -> DataLoader:
        return self._loader()


def source_info(path: Path) -> dict | None:
    """What identifies the file a graph was loaded from, cheaply (size and modification time)."""
    if not path.exists():
        return None
    stat = path.stat()
    return {"file": str(path.resolve()), "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _check_source_unchanged(store: Path, manifest: dict) -> None:
    source = manifest.get("source")
    if not source:
        return
    now = source_info(Path(source["file"]))
    if now is not None and (now["bytes"], now["mtime_ns"]) != (source["bytes"], source["mtime_ns"]):
        raise GraphStoreError(f"the graph store {store} is stale: {source['file']} changed after it was partitioned. "
                              f"Re-run `{manifest.get('command') or 'granndis partition ...'}`.")
