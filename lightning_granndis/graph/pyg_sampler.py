"""PyG's ``NeighborLoader`` without pyg-lib or torch-sparse: the plain-torch CSR sampler as its kernel.

``NeighborLoader`` draws its batches through ``torch_geometric.sampler.NeighborSampler``, whose
kernel is ``pyg-lib``'s or ``torch-sparse``'s ``neighbor_sample``; where neither installs (no
wheels for this torch), :class:`TorchNeighborSampler` draws the same kind of sample with
:func:`~lightning_granndis.graph.sampling.sample_subgraph` (each newly reached vertex expanded
once, ``num_neighbors[h]`` in-neighbours at hop ``h`` drawn without replacement, ``-1`` = all)::

    loader = NeighborLoader(data, num_neighbors=[15, 10, 5], batch_size=1024, input_nodes=data.train_mask,
                            neighbor_sampler=TorchNeighborSampler(data, [15, 10, 5]), shuffle=True)

Everything else (the CSC conversion, the batch's ``n_id``, ``batch_size``, feature slicing) is
PyG's own. Homogeneous graphs, directional sampling, no temporal or weighted sampling.
"""

from __future__ import annotations

import warnings

import torch

from lightning_granndis.graph.sampling import CSRGraph, sample_subgraph


def _sampler_base():
    from torch_geometric.sampler import NeighborSampler

    return NeighborSampler


class TorchNeighborSampler(_sampler_base()):
    """``torch_geometric.sampler.NeighborSampler`` with a plain-torch kernel.

    Args:
        data: a homogeneous PyG ``Data``.
        num_neighbors: neighbours per hop (``-1`` = all), one entry per layer.
        generator: random generator of the draws (default: torch's global one, as PyG's kernels).
    """

    def __init__(self, data, num_neighbors: list[int], generator: torch.Generator | None = None, **kwargs) -> None:
        with warnings.catch_warnings():  # "without a 'pyg-lib' installation is deprecated": this is the answer
            warnings.filterwarnings("ignore", message=".*pyg-lib.*")
            super().__init__(data, num_neighbors, **kwargs)
        if self.data_type.name != "homogeneous":
            raise ValueError("TorchNeighborSampler samples homogeneous graphs (a torch_geometric Data) only.")
        if self.subgraph_type.value != "directional" or self.replace or self.disjoint or self.node_time is not None:
            raise ValueError("TorchNeighborSampler draws directional samples without replacement, not disjoint, "
                             "not temporal; for those install pyg-lib and use PyG's NeighborSampler.")
        self.graph = CSRGraph(self.colptr, self.row, self.num_nodes)  # CSC = in-neighbour lists
        self.generator = generator

    def _sample(self, seed, seed_time=None, **kwargs):
        from torch_geometric.sampler import SamplerOutput

        if isinstance(seed, dict):
            raise ValueError("TorchNeighborSampler samples homogeneous graphs only.")
        sub = sample_subgraph(self.graph, seed, self.num_neighbors.get_mapped_values(), generator=self.generator)
        # PyG's layout: row = source (the neighbour), col = target, local ids; seeds first in node
        return SamplerOutput(node=sub.n_id, row=sub.edge_index[0], col=sub.edge_index[1], edge=None, batch=None)
