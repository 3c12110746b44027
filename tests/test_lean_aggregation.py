"""The lean sparse aggregation: PyG's results (outputs and gradients), the owned rows only for
paired convs, and less kept for backward than torch.sparse's own autograd."""

import pytest
import torch
from torch import nn
from torch_geometric.nn import GATConv, GCNConv, GINConv, GraphConv, SAGEConv

from lightning_granndis.graph.lean_aggregation import LeanAdjacency, SparseAggregate, lean_kind
from lightning_granndis.graph.masking import OneHopMasking, degree_stats
from lightning_granndis.graph.one_hop import split_one_hop

N, F = 120, 6


def bipartite(seed=0, n_dst=50, n_src=N, edges=700):
    g = torch.Generator().manual_seed(seed)
    edge_index = torch.stack([torch.randint(0, n_src, (edges,), generator=g),   # duplicates included
                              torch.randint(0, n_dst, (edges,), generator=g)])
    return edge_index, torch.randn(n_src, F, generator=g), torch.rand(edges, generator=g)


@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
def test_sparse_aggregate_equals_scatter(reduce, weighted):
    from torch_geometric.utils import scatter

    edge_index, x, w = bipartite()
    weight = w if weighted else None
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    # the sources in two column blocks (owned rows, halo rows), as a paired conv aggregates them
    graph = LeanAdjacency.build(edge_index, 50, [70, N - 70], weight)
    out = SparseAggregate.apply(graph, reduce == "mean", x1[:70], x1[70:])
    messages = x2[edge_index[0]] * (w.unsqueeze(1) if weighted else 1)
    ref = scatter(messages, edge_index[1], 0, dim_size=50, reduce=reduce)
    assert torch.allclose(out, ref, atol=1e-5)
    probe = torch.linspace(-1, 1, out.numel()).view_as(out)
    (out * probe).sum().backward()
    (ref * probe).sum().backward()
    assert torch.allclose(x1.grad, x2.grad, atol=1e-5)


def test_which_convs_take_the_lean_path():
    assert lean_kind(SAGEConv(F, 4)) == "paired" and lean_kind(GraphConv(F, 4)) == "paired"
    assert lean_kind(GINConv(nn.Linear(F, 4))) == "paired" and lean_kind(GCNConv(F, 4)) == "square"
    assert lean_kind(SAGEConv(F, 4, aggr="max")) is None  # torch.sparse's own max reduction instead
    assert lean_kind(GATConv(F, 4)) is None

    class MySAGE(SAGEConv):  # a subclass may change forward: not assumed to take pairs
        pass

    assert lean_kind(MySAGE(F, 4)) is None


class Stack(nn.Module):
    def __init__(self, kind):
        super().__init__()
        make = {"sage": lambda a, b: SAGEConv(a, b), "gcn": lambda a, b: GCNConv(a, b),
                "graph": lambda a, b: GraphConv(a, b), "gin": lambda a, b: GINConv(nn.Linear(a, b))}[kind]
        self.convs = nn.ModuleList([make(F, 8), make(8, 8), make(8, 3)])

    def forward(self, x, edge_index):
        for conv in self.convs[:-1]:
            x = torch.relu(conv(x, edge_index))
        return self.convs[-1](x, edge_index)


def run_split(model, x, edge_index, parts, lean, saved=None):
    """Every part of a split of the whole graph through the hooks (the halo rows read from the
    whole ``x`` at each layer, as the exchange would deliver them); outputs by vertex id."""
    owner = torch.arange(N) % parts
    graphs = split_one_hop(edge_index, torch.arange(N), owner, parts)
    out = torch.empty(N, 3)
    for g in graphs:
        layer_inputs = {}

        def exchange(rows, graph, g=g):
            # the halo rows: the same layer's input rows of their owners, from an unsplit forward
            return layer_inputs["x"][g.n_id[g.n_owned:]]

        def keep_input(module, args, kwargs):
            layer_inputs["x"] = full_inputs[module]

        masking = OneHopMasking(model, exchange, degree_stats=degree_stats(edge_index, N), lean_aggregation=lean)
        handles = [conv.register_forward_pre_hook(keep_input, with_kwargs=True, prepend=True) for conv in model.convs]
        masking.activate(g)
        if saved is None:
            o = model(x[g.n_id[: g.n_owned]], edge_index)
        else:
            with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
                o = model(x[g.n_id[: g.n_owned]], edge_index)
        for h in handles:
            h.remove()
        masking.remove()
        out[g.n_id[: g.n_owned]] = o.detach()
        assert all("message_and_aggregate" not in conv.__dict__ for conv in model.convs)  # nothing left set
    return out


@pytest.mark.parametrize("kind", ["sage", "gcn", "graph", "gin"])
def test_masked_split_on_the_lean_path_equals_the_whole_graph(kind):
    torch.manual_seed(0)
    model = Stack(kind)
    g = torch.Generator().manual_seed(1)
    edge_index = torch.randint(0, N, (2, 900), generator=g)
    x = torch.randn(N, F, generator=g)
    global full_inputs
    full_inputs = {}
    hooks = [conv.register_forward_pre_hook(lambda m, a: full_inputs.__setitem__(m, a[0].detach()))
             for conv in model.convs]
    ref = model(x, edge_index).detach()
    for h in hooks:
        h.remove()
    for lean in (True, False):
        assert torch.allclose(run_split(model, x, edge_index, 3, lean), ref, atol=1e-5)


def test_the_lean_path_keeps_less_for_backward():
    torch.manual_seed(0)
    model = Stack("sage")
    g = torch.Generator().manual_seed(1)
    edge_index = torch.randint(0, N, (2, 900), generator=g)
    x = torch.randn(N, F, generator=g, requires_grad=True)
    global full_inputs
    full_inputs = {}
    hooks = [conv.register_forward_pre_hook(lambda m, a: full_inputs.__setitem__(m, a[0].detach()))
             for conv in model.convs]
    model(x, edge_index)
    for h in hooks:
        h.remove()
    kept = {}
    for lean in (True, False):
        saved: list[int] = []
        run_split(model, x, edge_index, 3, lean, saved)
        kept[lean] = sum(saved)
    # torch.sparse's autograd keeps each layer's owned + halo input and its output over all rows
    assert kept[True] < 0.7 * kept[False], kept
