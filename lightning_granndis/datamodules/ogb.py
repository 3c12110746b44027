"""OGB node-property-prediction graphs through the ``ogb`` package's own loader."""

from __future__ import annotations

import contextlib
import functools
import warnings
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

from lightning_granndis.datamodules import synthetic
from lightning_granndis.datamodules.graph_store import GraphStoreDataModule
from lightning_granndis.graph.validation import validate_graph

#: datasets whose edges are directed citations, used as undirected graphs (OGB's examples do too)
DIRECTED = ("ogbn-arxiv", "ogbn-papers100M", "ogbn-mag")

#: what a preset needs in host memory once loaded (features + undirected edge_index + labels)
MEMORY = {
    "synthetic-tiny": "~1 MB",
    "synthetic-small": "~10 MB",
    "synthetic-arxiv": "~130 MB",
    "synthetic-arxiv4x": "~450 MB",
    "synthetic-products": "~3 GB (one process cannot train it here: partition it, see `granndis partition`)",
    "ogbn-arxiv": "~130 MB",
    "ogbn-products": "~2 GB",
    "ogbn-papers100M": "~80 GB (features 57 GB, memory-mapped and shared by the ranks of a server)",
}


@contextlib.contextmanager
def _exclusive(lock: Path):
    """Holds an exclusive lock on the file ``lock`` (processes on one machine, or sharing a file
    system that supports ``flock``)."""
    import fcntl

    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def _reading_ogb():
    """Around ogb's own reading code. ogb 1.3.6 calls ``torch.load`` bare. Since torch 2.6 that is
    a weights-only load, which refuses PyG's ``Data``; we allow exactly PyG's data classes, and
    memory-map the file so the ranks of one server share its pages instead of each holding a copy.
    ogb also wraps read-only NumPy arrays (labels, split indices) in tensors, which torch warns
    about once per process, i.e. once per rank; nothing writes into them, so that warning goes."""
    from torch_geometric.data.data import Data, DataEdgeAttr, DataTensorAttr
    from torch_geometric.data.storage import EdgeStorage, GlobalStorage, NodeStorage

    original = torch.load
    torch.load = functools.partial(original, weights_only=True, mmap=True)
    try:
        with torch.serialization.safe_globals([Data, DataEdgeAttr, DataTensorAttr, GlobalStorage, NodeStorage,
                                               EdgeStorage]), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            yield
    finally:
        torch.load = original


class OGBNodeDataModule(pl.LightningDataModule):
    """An OGB node-property-prediction graph as one PyG ``Data``, full batch.

    Args:
        name: ``ogbn-arxiv``, ``ogbn-products``, ``ogbn-papers100M`` (any homogeneous ``ogbn-*`` the
            ``ogb`` package knows), or an embedded default ``synthetic-tiny``, ``synthetic-small``,
            ``synthetic-arxiv`` (generated on first use, written in OGB's layout, read by the
            same loader).
        root: directory holding the datasets (default ``data``).
        seed: seed of a synthetic graph (default 0).
        undirected: add reverse edges; default: for the datasets of :data:`DIRECTED` and the
            synthetic ones.
        store: a graph store made from this dataset (``granndis partition``): the loaders then yield
            the store's handle and no process loads the graph; each rank of a GNN strategy reads
            only its own server's shard.

    After ``setup`` the graph is :attr:`data` with ``x`` [N, F] float, ``edge_index`` [2, E],
    ``y`` [N] long and ``train_mask``/``val_mask``/``test_mask`` [N] bool; :attr:`evaluator` is
    the OGB ``Evaluator`` (``ogbn-arxiv``'s accuracy for the synthetic graphs). Each dataloader
    yields that ``Data`` once per epoch; the GNN strategies partition it themselves.

    Real datasets cannot be downloaded where this package is built; when one is missing, the
    error says where to put its files.
    """

    def __init__(self, name: str = "synthetic-tiny", root: str = "data", seed: int = 0,
                 undirected: bool | None = None, store: str | None = None) -> None:
        super().__init__()
        self.store = store
        self.name, self.root, self.seed = name, Path(root), seed
        self.synthetic = name.startswith("synthetic-")
        self.undirected = undirected if undirected is not None else (self.synthetic or name in DIRECTED)
        self.data = None
        self.evaluator = None
        self.num_features = 0
        self.num_classes = 0
        if self.synthetic and name.split("-", 1)[1] not in synthetic.PRESETS:
            raise ValueError(f"Unknown synthetic graph {name!r}; known: "
                             f"{', '.join('synthetic-' + p for p in synthetic.PRESETS)}.")

    # ------------------------------------------------------------------ loading
    def _meta(self) -> dict | None:
        if not self.synthetic:
            return None
        _, meta = synthetic.write_ogb_layout(self.root, self.name.split("-", 1)[1], self.seed)
        return meta

    def _check_present(self) -> None:
        import pandas as pd
        import ogb.nodeproppred

        master = pd.read_csv(Path(ogb.nodeproppred.__file__).parent / "master.csv", index_col=0,
                             keep_default_na=False)
        if self.name not in master:
            raise ValueError(f"Unknown dataset {self.name!r}. OGB node datasets: {', '.join(master.keys())}; "
                             f"embedded defaults: {', '.join('synthetic-' + p for p in synthetic.PRESETS)}.")
        info = master[self.name]
        if info["is hetero"] == "True":
            raise ValueError(f"{self.name} is heterogeneous; OGBNodeDataModule loads homogeneous graphs.")
        folder = self.dataset_dir
        raw = "data.npz" if info["binary"] == "True" else "edge.csv.gz"
        if not ((folder / "processed" / "geometric_data_processed.pt").exists() or (folder / "raw" / raw).exists()):
            raise FileNotFoundError(
                f"{self.name} is not under {self.root} and cannot be downloaded here. On a machine with "
                f"network access, download {info['url']}, unzip it, and place its folder as {folder} "
                f"(so that {folder / 'raw' / raw} exists), then run again. Or use an embedded default "
                f"graph: name='synthetic-arxiv'."
            )

    def _dataset(self):
        from ogb.nodeproppred import PygNodePropPredDataset

        # generation and OGB's processing write files others would read half-written (every rank
        # may call prepare_data, e.g. under torchrun): one process prepares, the others wait
        self.root.mkdir(parents=True, exist_ok=True)
        with _exclusive(self.root / f".{self.dataset_dir.name}.lock"):
            meta = self._meta()
            if meta is None:
                self._check_present()
            if not self.processed_file().exists():
                with _reading_ogb():
                    return PygNodePropPredDataset(name=self.name, root=str(self.root), meta_dict=meta)
        with _reading_ogb():  # prepared: read without holding the others up
            return PygNodePropPredDataset(name=self.name, root=str(self.root), meta_dict=meta)

    def prepare_data(self) -> None:
        # Lightning calls this once per node (local rank 0): generation and OGB's processing.
        if self.store is None:
            self._dataset()

    @property
    def dataset_dir(self) -> Path:
        """The dataset's folder in OGB's layout (``raw/``, ``processed/``)."""
        return self.root / self.name.replace("-", "_")

    def processed_file(self) -> Path:
        """The file OGB's loader reads the processed graph from."""
        return self.dataset_dir / "processed" / "geometric_data_processed.pt"

    def _check_fits(self) -> None:
        """Refuses, on every rank alike, to load a graph that every local process would hold
        whole when they would not fit in this machine's memory together."""
        trainer = getattr(self, "trainer", None)
        local = int(getattr(trainer, "num_devices", 1) or 1) if trainer is not None else 1
        counts = self.dataset_dir / "raw" / "num-edge-list.csv.gz"
        if local <= 1 or not counts.exists():
            return
        import pandas as pd

        edges = int(pd.read_csv(counts, header=None).values.sum()) * (2 if self.undirected else 1)
        features = self.processed_file().stat().st_size if self.processed_file().exists() else 0
        # per process: its undirected edge_index and the copies sorting it makes; features are
        # memory-mapped, shared by the node's processes
        need = local * 4 * edges * 16 + features
        available = _available_memory()
        if available and need > 0.8 * available:
            raise MemoryError(
                f"{self.name} would need ~{need / 2**30:.1f} GiB to load in each of the {local} processes of this "
                f"machine (every rank would hold the whole graph), but {available / 2**30:.1f} GiB is available. "
                f"Partition it once and train from the store: `granndis partition --dataset {self.name} "
                f"--root {self.root} --servers S --devices G --mode eas --out stores/{self.name}`, then "
                f"OGBNodeDataModule({self.name!r}, store='stores/{self.name}')."
            )

    def setup(self, stage: str | None = None) -> None:
        if self.data is not None:
            return
        if self.store is not None:
            inner = GraphStoreDataModule(self.store, dataset=self.name)
            inner.setup(stage)
            self.data, self.num_features, self.num_classes = inner.handle, inner.num_features, inner.num_classes
            return
        self._check_fits()
        from ogb.nodeproppred import Evaluator
        from torch_geometric.data import Data
        from torch_geometric.utils import to_undirected

        dataset = self._dataset()
        graph = dataset[0]
        n = graph.num_nodes
        with _reading_ogb():
            split = dataset.get_idx_split()
        masks = {}
        for key, ogb_key in (("train_mask", "train"), ("val_mask", "valid"), ("test_mask", "test")):
            mask = torch.zeros(n, dtype=torch.bool)
            mask[split[ogb_key]] = True
            masks[key] = mask
        edge_index = graph.edge_index
        if self.undirected:
            edge_index = to_undirected(edge_index, num_nodes=n)
        y = graph.y.view(-1)
        y = torch.where(torch.isfinite(y.float()), y.float(), torch.full_like(y.float(), -1)).long()
        data = Data(x=graph.x, edge_index=edge_index, y=y, num_nodes=n, **masks)
        self.num_classes = int(dataset.num_classes)
        validate_graph(data, self.num_classes, name=self.name)
        self.data = data
        self.num_features = data.num_features
        self.evaluator = Evaluator("ogbn-arxiv" if self.synthetic else self.name)

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, pred: torch.Tensor, split: str = "test") -> float:
        """OGB accuracy of ``pred`` (class ids, [N] or [N, 1]) on ``split`` (train, val, test)."""
        if self.store is not None:
            raise RuntimeError("a store-backed OGBNodeDataModule holds no labels in this process; the GNN "
                               "strategies count accuracy over each rank's shard (their val_acc/test_acc).")
        mask = getattr(self.data, f"{split}_mask")
        y_true = self.data.y[mask].view(-1, 1)
        y_pred = pred.view(-1)[mask].view(-1, 1)
        return float(self.evaluator.eval({"y_true": y_true, "y_pred": y_pred})["acc"])

    # ------------------------------------------------------------------ loaders
    def _full_batch(self) -> DataLoader:
        return DataLoader([self.data], batch_size=None, collate_fn=lambda d: d)

    def train_dataloader(self) -> DataLoader:
        return self._full_batch()

    def val_dataloader(self) -> DataLoader:
        return self._full_batch()

    def test_dataloader(self) -> DataLoader:
        return self._full_batch()

    def predict_dataloader(self) -> DataLoader:
        """The whole graph: the GNN strategies predict every vertex (exact full-graph inference)."""
        return self._full_batch()


def _available_memory() -> int:
    """Bytes of memory available for new allocations (Linux ``MemAvailable``), 0 if unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
