"""TorchNeighborSampler: PyG's NeighborLoader with the plain-torch kernel draws real samples in
PyG's layout, with the per-hop fan-outs it is given."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.loader import NeighborLoader

from lightning_granndis.graph.pyg_sampler import TorchNeighborSampler


def test_neighbor_loader_batches_are_seeds_first_real_edges_and_fanouts_respected(tiny):
    data = tiny.data
    torch.manual_seed(0)
    loader = NeighborLoader(data, num_neighbors=[4, 3, 2], batch_size=100, input_nodes=data.train_mask,
                            shuffle=True, neighbor_sampler=TorchNeighborSampler(data, [4, 3, 2]))
    train = data.train_mask.nonzero().flatten()
    assert len(loader) == -(-train.numel() // 100)
    edges = set(map(tuple, data.edge_index.t().tolist()))
    seen = []
    for batch in loader:
        seeds = batch.n_id[: batch.batch_size]
        seen.append(seeds)
        assert bool(data.train_mask[seeds].all())
        assert torch.equal(batch.x, data.x[batch.n_id]) and torch.equal(batch.y, data.y[batch.n_id])
        src, dst = batch.n_id[batch.edge_index]
        assert all((int(u), int(v)) in edges for u, v in zip(src.tolist(), dst.tolist()))  # messages u -> v
        # a seed keeps at most 4 in-neighbours (the first hop's fan-out)
        into_seed = batch.edge_index[1][batch.edge_index[1] < batch.batch_size]
        assert int(torch.bincount(into_seed).max()) <= 4
    covered = torch.cat(seen)
    assert covered.numel() == train.numel() and torch.equal(covered.sort().values, train)


def test_what_the_kernel_cannot_do_is_refused(tiny):
    with pytest.raises(ValueError, match="without replacement"):
        TorchNeighborSampler(tiny.data, [2, 2], replace=True)
