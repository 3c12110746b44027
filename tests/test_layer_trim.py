"""Trimmed layers (``trim_layers``, PyG's ``trim_to_layer``): per-layer plans that shrink hop by
hop and still match pairwise, and seeds' outputs and gradients equal to the masked untrimmed
layers for every conv family, on a sampled batch."""

import pytest
import torch
from torch_geometric.nn import GAT, GCN, GIN, GraphSAGE

from lightning_granndis.graph.masking import OneHopMasking, degree_stats
from lightning_granndis.graph.one_hop import OneHopGraph, OneHopSplit
from lightning_granndis.graph.sampling import CSRGraph
from lightning_granndis.graph.server_subgraph import sampled_subgraph

N, F = 400, 8


def sampled_batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    edge_index = torch.randint(0, N, (2, 3000), generator=g)
    seeds = torch.randperm(N, generator=g)[:30]
    sub = sampled_subgraph(CSRGraph.from_edge_index(edge_index, N), seeds, [4, 3, 2], 3, generator=g)
    return edge_index, torch.randn(N, F, generator=g), sub


def test_co_batch_parts_trim_hop_by_hop_with_matching_plans():
    _, _, sub = sampled_batch()
    owner = torch.arange(sub.num_nodes) % 3
    split = OneHopSplit(sub.edge_index, sub.n_id, owner, 3, sub.hop, sub.seed, 3)
    graphs = [split.graph(p) for p in range(3)]
    for p, g in enumerate(graphs):
        assert g.trimmable()
        trims = [g.layer_trim(k) for k in range(3)]
        assert trims[0].n_in == g.n_owned and trims[-1].n_out == int(g.seed.sum())
        assert [t.n_out for t in trims] == sorted((t.n_out for t in trims), reverse=True)
        assert trims[1].n_in == trims[0].n_out < g.n_owned  # the last hop is gone after layer 0
        for k, t in enumerate(trims):
            assert t.plan.send_index.numel() and int(t.plan.send_index.max()) < t.n_in  # sends read its rows
            for q, peer in enumerate(graphs):  # what q sends p at layer k is what p receives
                assert t.plan.recv_splits[q] == peer.layer_trim(k).plan.send_splits[p]
            edges, _ = t.edges(g, g.layer_edge_index(k, 3), None)
            assert int(edges[1].max()) < t.n_out and int(edges[0].max()) < t.n_in + sum(t.plan.recv_splits)


def test_rows_out_of_hop_order_are_not_trimmed():
    _, _, sub = sampled_batch()
    perm = torch.randperm(sub.num_nodes, generator=torch.Generator().manual_seed(3))
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(perm.numel())
    shuffled = OneHopGraph(sub.num_nodes, sub.n_id[perm], inverse[sub.edge_index], torch.empty(0, dtype=torch.long),
                           [0], [0], sub.hop[perm], sub.seed[perm], 3, halo_hop=torch.empty(0, dtype=torch.long))
    assert not shuffled.trimmable()


@pytest.mark.parametrize("family", [GraphSAGE, GCN, GIN, GAT])
@pytest.mark.parametrize("lean", [True, False])
def test_trimmed_seeds_equal_masked_untrimmed(family, lean):
    edge_index, x, sub = sampled_batch()
    torch.manual_seed(0)
    model = family(F, 16, 3, out_channels=5)
    results = {}
    for trim in (False, True):
        graph = OneHopGraph(sub.num_nodes, sub.n_id, sub.edge_index, torch.empty(0, dtype=torch.long), [0], [0],
                            sub.hop, sub.seed, 3, halo_hop=torch.empty(0, dtype=torch.long))
        masking = OneHopMasking(model, lambda rows, g: rows[:0], degree_stats=degree_stats(edge_index, N),
                                lean_aggregation=lean, trim_layers=trim)
        seen = []
        hook = model.convs[1].register_forward_pre_hook(lambda m, a: seen.append(a[0].shape[0]), prepend=True)
        masking.activate(graph)
        model.zero_grad()
        out = model(x[sub.n_id], graph.edge_index)
        out[sub.seed].pow(2).sum().backward()
        results[trim] = out, [p.grad.clone() for p in model.parameters()], seen[0]
        hook.remove()
        masking.remove()
    (trimmed, grads, rows), (whole, whole_grads, whole_rows) = results[True], results[False]
    assert trimmed.shape == whole.shape  # a row per vertex again after the last layer
    assert rows < whole_rows == sub.num_nodes  # the second layer read fewer rows
    assert torch.allclose(trimmed[sub.seed], whole[sub.seed], atol=1e-5)
    assert not trimmed[~sub.seed].any()  # the padding
    for a, b in zip(grads, whole_grads):
        assert torch.allclose(a, b, atol=1e-5)


def test_a_model_that_skips_the_trimmed_rows_is_told_how_many_rows_it_needs():
    edge_index, x, sub = sampled_batch()
    model = GraphSAGE(F, 16, 3, out_channels=5)
    graph = OneHopGraph(sub.num_nodes, sub.n_id, sub.edge_index, torch.empty(0, dtype=torch.long), [0], [0],
                        sub.hop, sub.seed, 3, halo_hop=torch.empty(0, dtype=torch.long))
    masking = OneHopMasking(model, lambda rows, g: rows[:0], trim_layers=True)
    masking.activate(graph)
    with pytest.raises(ValueError, match="at least .* rows .*trim_layers"):
        model.convs[1](torch.zeros(3, 16), graph.edge_index)
