"""Sparse-matrix aggregation: a CSR adjacency gives the same outputs and gradients as edge_index,
for the convs that support it, alone and under One-Hop Graph Masking."""

import pytest
import torch
from torch import nn
from torch_geometric.nn import GATConv, GCNConv, GINConv, GraphConv, SAGEConv

from lightning_granndis.graph.adjacency import csr_adjacency, supports_sparse_aggregation
from lightning_granndis.graph.masking import OneHopMasking, degree_stats
from lightning_granndis.graph.one_hop import split_one_hop

N, F = 120, 6


def graph(seed=0):
    g = torch.Generator().manual_seed(seed)
    edge_index = torch.randint(0, N, (2, 900), generator=g)  # duplicates and self loops included
    return edge_index, torch.randn(N, F, generator=g)


def outputs_and_grads(conv, x, edge_index):
    x = x.clone().requires_grad_()
    out = conv(x, edge_index)
    grads = torch.autograd.grad((out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum(),
                                [x, *conv.parameters()])
    return out.detach(), grads


CONVS = {
    "sage_mean": lambda: SAGEConv(F, 4),
    "sage_max": lambda: SAGEConv(F, 4, aggr="max"),
    "sage_sum": lambda: SAGEConv(F, 4, aggr="sum"),
    "graph": lambda: GraphConv(F, 4),
    "gin": lambda: GINConv(nn.Linear(F, 4)),
    "gcn_unnormalised": lambda: GCNConv(F, 4, normalize=False),
}


@pytest.mark.parametrize("name", CONVS)
def test_csr_aggregation_equals_edge_index(name):
    torch.manual_seed(0)
    conv = CONVS[name]()
    edge_index, x = graph()
    assert supports_sparse_aggregation(conv, "cpu")
    ref, ref_grads = outputs_and_grads(conv, x, edge_index)
    out, grads = outputs_and_grads(conv, x, csr_adjacency(edge_index, N))
    assert torch.allclose(out, ref, atol=1e-5)
    for a, b in zip(grads, ref_grads):
        assert torch.allclose(a, b, atol=1e-5)


def test_weighted_csr_equals_edge_weight():
    torch.manual_seed(0)
    conv = GCNConv(F, 4, normalize=False)
    edge_index, x = graph()
    weight = torch.rand(edge_index.shape[1])
    ref = conv(x, edge_index, weight)
    assert torch.allclose(conv(x, csr_adjacency(edge_index, N, weight)), ref, atol=1e-5)


def test_convs_needing_per_edge_messages_keep_edge_index():
    assert not supports_sparse_aggregation(GATConv(F, 4), "cpu")
    assert not supports_sparse_aggregation(SAGEConv(F, 4, aggr="lstm"), "cpu")
    assert not supports_sparse_aggregation(SAGEConv(F, 4, aggr="max"), "cuda")  # torch has no CUDA max spmm
    assert supports_sparse_aggregation(SAGEConv(F, 4), "cuda")


class Stack(nn.Module):
    def __init__(self, kind):
        super().__init__()
        make = {"sage": lambda a, b: SAGEConv(a, b), "gcn": lambda a, b: GCNConv(a, b),
                "gat": lambda a, b: GATConv(a, b)}[kind]
        self.convs = nn.ModuleList([make(F, 8), make(8, 8), make(8, 3)])

    def forward(self, x, edge_index):
        for conv in self.convs[:-1]:
            x = torch.relu(conv(x, edge_index))
        return self.convs[-1](x, edge_index)


@pytest.mark.parametrize("kind", ["sage", "gcn", "gat"])
def test_masking_hooks_agree_on_both_paths(kind):
    """One part holding the whole graph: both aggregation paths equal the unhooked model."""
    torch.manual_seed(0)
    model = Stack(kind)
    edge_index, x = graph()
    ref, ref_grads = outputs_and_grads(model, x, edge_index)
    one_hop = split_one_hop(edge_index, torch.arange(N), torch.zeros(N, dtype=torch.long), 1)[0]
    used = []
    for sparse in (True, False):
        masking = OneHopMasking(model, exchange=lambda rows, g: rows[:0], degree_stats=degree_stats(edge_index, N),
                                sparse_aggregation=sparse)
        seen = []
        masking.activate(one_hop)
        probe = model.convs[0].register_forward_pre_hook(lambda m, a, k: seen.append(
            (a[1] if len(a) > 1 else k["edge_index"]).layout), with_kwargs=True)
        out, grads = outputs_and_grads(model, x, edge_index)
        masking.remove()
        probe.remove()
        used.append(seen[0])
        assert torch.allclose(out, ref, atol=1e-5)
        for a, b in zip(grads, ref_grads):
            assert torch.allclose(a, b, atol=1e-5)
    # the probe runs after the masking hook: the conv really received a CSR where it can
    assert used == [torch.sparse_csr if kind != "gat" else torch.strided, torch.strided]
