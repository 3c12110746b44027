"""Flexible preloading: the L-hop closure is k_hop_subgraph's, and masked layers are exact."""

import torch
from torch_geometric.nn import SAGEConv
from torch_geometric.utils import k_hop_subgraph, subgraph

from lightning_granndis.datamodules.synthetic import PRESETS, generate
from lightning_granndis.graph import CSRGraph, metis_partition
from lightning_granndis.graph.preload import exactness_masks, preload_dependencies


def _graph():
    g = generate(PRESETS["tiny"])
    ei = torch.as_tensor(g["edge"]).t()
    ei = torch.unique(torch.cat([ei, ei.flip(0)], 1), dim=1)
    n = PRESETS["tiny"].num_nodes
    return ei, n, torch.as_tensor(g["x"])


def test_closure_matches_k_hop_subgraph_and_orders_inner_first():
    ei, n, _ = _graph()
    inner = metis_partition(ei, n, 2).part(0)
    vertices, hop = preload_dependencies(CSRGraph.from_edge_index(ei, n), inner, 2)
    subset = k_hop_subgraph(inner, 2, ei, num_nodes=n)[0]
    assert set(vertices.tolist()) == set(subset.tolist()) and len(vertices) == len(subset)
    assert torch.equal(vertices[: len(inner)], inner) and torch.all(hop[: len(inner)] == 0)
    assert torch.all(hop[1:] >= hop[:-1]) and int(hop.max()) == 2


def test_masked_layers_give_exact_outputs_for_inner_vertices():
    ei, n, x = _graph()
    torch.manual_seed(0)
    convs = [SAGEConv(x.shape[1], 16), SAGEConv(16, 16), SAGEConv(16, 8)]
    outs, full = [], x
    for conv in convs:
        full = torch.relu(conv(full, ei))
        outs.append(full)
    inner = metis_partition(ei, n, 4).part(1)
    vertices, hop = preload_dependencies(CSRGraph.from_edge_index(ei, n), inner, len(convs))
    local_ei, _ = subgraph(vertices, ei, relabel_nodes=True, num_nodes=n)
    h = x[vertices]
    for conv, mask, out in zip(convs, exactness_masks(hop, len(convs)), outs):
        h = torch.relu(conv(h, local_ei))
        exact = ~mask
        torch.testing.assert_close(h[exact], out[vertices][exact], atol=1e-5, rtol=1e-5)
        h = h.masked_fill(mask[:, None], 0.0)
    torch.testing.assert_close(h[: len(inner)], full[inner], atol=1e-5, rtol=1e-5)
    # without preloading the boundary's neighbours, inner outputs would be wrong
    local_ei2, _ = subgraph(inner, ei, relabel_nodes=True, num_nodes=n)
    h2 = x[inner]
    for conv in convs:
        h2 = torch.relu(conv(h2, local_ei2))
    assert (h2 - full[inner]).abs().max() > 1e-3
