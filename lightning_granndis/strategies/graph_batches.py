"""What a GNN strategy's dataloaders yield on each rank: its own one-hop graphs as PyG ``Data``."""

from __future__ import annotations

import torch

from lightning_granndis.graph.one_hop import OneHopGraph


def graph_from_loader(dataloader: object):
    """The whole graph a full-batch loader yields (its first batch: a PyG ``Data``)."""
    from torch_geometric.data import Data

    data = next(iter(dataloader))
    if isinstance(data, (list, tuple)) and len(data) == 1:
        data = data[0]
    if not isinstance(data, Data):
        raise TypeError(
            f"the GNN strategies expect dataloaders that yield the whole graph as one torch_geometric Data "
            f"(e.g. OGBNodeDataModule), got {type(data).__name__}."
        )
    for key in ("x", "edge_index", "y", "train_mask"):
        if getattr(data, key, None) is None:
            raise ValueError(f"the graph has no `{key}`; the GNN strategies need x, edge_index, y and train_mask.")
    return data


def rank_batch(data, graph: OneHopGraph, key: int):
    """The rank's (light) batch for ``graph``: owned vertex ids ``n_id``, the split masks limited to
    seed vertices, the local ``edge_index`` (sources may be halo rows) and ``granndis_key``.
    Features and labels are added by :func:`materialise` when the batch is used, so a strategy can
    hold many iterations' batches without copying features."""
    from torch_geometric.data import Data

    owned = graph.n_id[: graph.n_owned].cpu()
    seed = graph.seed.cpu()
    batch = Data(edge_index=graph.edge_index, n_id=owned, num_nodes=graph.n_owned)
    for split in ("train_mask", "val_mask", "test_mask"):
        mask = getattr(data, split, None)
        if mask is not None:
            batch[split] = mask[owned] & seed
    batch.granndis_key = torch.tensor(key)
    return batch


def materialise(batch, data):
    """A copy of ``batch`` with ``x`` and ``y`` of its vertices taken from the whole graph."""
    out = batch.clone()
    n_id = batch.n_id.cpu()
    out.x, out.y = data.x[n_id], data.y[n_id]
    return out


class GraphBatches:
    """A re-iterable, sized sequence of a rank's batches (one epoch)."""

    def __init__(self, batches: list) -> None:
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        return iter(self.batches)
