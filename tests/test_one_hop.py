"""One-hop graphs: split plans that match pairwise, and layer-by-layer exactness in one process."""

import pytest
import torch
from torch_geometric.nn import GATConv, GCNConv, SAGEConv

from lightning_granndis.graph.masking import degree_stats, gcn_degree, local_gcn_edges
from lightning_granndis.graph.one_hop import simulate_exchange, split_one_hop


def random_graph(n=300, e=2400, seed=0):
    g = torch.Generator().manual_seed(seed)
    edge_index = torch.randint(0, n, (2, e), generator=g)
    return edge_index, torch.randn(n, 12, generator=g)


def test_split_plans_match_and_cover_every_edge():
    edge_index, _ = random_graph()
    n = 300
    owner = torch.arange(n) % 3
    graphs = split_one_hop(edge_index, torch.arange(n), owner, 3)
    assert sum(g.n_owned for g in graphs) == n
    assert sum(g.edge_index.shape[1] for g in graphs) == edge_index.shape[1]
    for p, g in enumerate(graphs):
        assert int(g.edge_index[1].max()) < g.n_owned  # every target owned
        assert (owner[g.n_id[: g.n_owned]] == p).all()
        assert (owner[g.n_id[g.n_owned:]] != p).all()
        for q, peer in enumerate(graphs):
            assert g.recv_splits[q] == peer.send_splits[p]
        assert g.send_splits[p] == 0 and g.recv_splits[p] == 0
    # edges map back to the original ones
    back = torch.cat([torch.stack([g.n_id[g.edge_index[0]], g.n_id[g.edge_index[1]]]) for g in graphs], 1)
    key = lambda ei: torch.sort(ei[0] * n + ei[1]).values  # noqa: E731
    assert torch.equal(key(back), key(edge_index))


def test_simulated_exchange_delivers_the_halo_rows():
    edge_index, x = random_graph()
    owner = torch.randint(0, 4, (300,), generator=torch.Generator().manual_seed(1))
    graphs = split_one_hop(edge_index, torch.arange(300), owner, 4)
    full = simulate_exchange(graphs, [x[g.n_id[: g.n_owned]] for g in graphs])
    for g, rows in zip(graphs, full):
        assert torch.equal(rows, x[g.n_id])


@pytest.mark.parametrize("conv", ["sage", "gat", "gcn"])
def test_layerwise_split_equals_full_graph(conv):
    edge_index, x = random_graph()
    n = 300
    torch.manual_seed(0)
    layers = {"sage": lambda: [SAGEConv(12, 8), SAGEConv(8, 8)],
              "gat": lambda: [GATConv(12, 8), GATConv(8, 8)],
              "gcn": lambda: [GCNConv(12, 8), GCNConv(8, 8)]}[conv]()
    full = x
    for layer in layers:
        full = layer(full, edge_index).relu()
    owner = torch.randint(0, 3, (n,), generator=torch.Generator().manual_seed(2))
    graphs = split_one_hop(edge_index, torch.arange(n), owner, 3)
    degree = gcn_degree(degree_stats(edge_index, n))
    h = [x[g.n_id[: g.n_owned]] for g in graphs]
    for layer in layers:
        rows = simulate_exchange(graphs, h)
        nxt = []
        for g, r in zip(graphs, rows):
            if conv == "gcn":  # local graph + global degrees, normalisation off
                ei, w = local_gcn_edges(g, degree)
                layer.normalize = False
                out = layer(r, ei, w.float())
                layer.normalize = True
            else:
                out = layer(r, g.edge_index)
            nxt.append(out[: g.n_owned].relu())
        h = nxt
    for g, out in zip(graphs, h):
        assert torch.allclose(out, full[g.n_id[: g.n_owned]], atol=1e-5)


def test_masks_follow_hop_distance():
    hop = torch.tensor([0, 0, 1, 2, 3])
    graphs = split_one_hop(torch.empty(2, 0, dtype=torch.long), torch.arange(5), torch.zeros(5, dtype=torch.long), 1,
                           hop=hop, exact_hops=3)
    masks = graphs[0].input_masks(3)
    assert masks[0] is None  # features are exact everywhere
    assert masks[1].tolist() == [False, False, False, False, True]
    assert masks[2].tolist() == [False, False, False, True, True]
    approx = split_one_hop(torch.empty(2, 0, dtype=torch.long), torch.arange(5), torch.zeros(5, dtype=torch.long), 1,
                           hop=hop, exact_hops=None)
    assert approx[0].input_masks(3) == [None, None, None]


def test_owner_out_of_range_is_rejected():
    with pytest.raises(ValueError, match=r"part in \[0, 2\)"):
        split_one_hop(torch.empty(2, 0, dtype=torch.long), torch.arange(3), torch.tensor([0, 1, 2]), 2)


def test_layer_edges_skip_aggregations_the_next_layer_masks():
    # chain 3 -> 2 -> 1 -> 0 with hops 3, 2, 1, 0 and L = 3
    edge_index = torch.tensor([[3, 2, 1], [2, 1, 0]])
    hop = torch.tensor([0, 1, 2, 3])
    g = split_one_hop(edge_index, torch.arange(4), torch.zeros(4, dtype=torch.long), 1, hop=hop, exact_hops=3)[0]
    dst_hops = [sorted(g.hop[g.layer_edge_index(k, 3)[1]].tolist()) for k in range(3)]
    assert dst_hops == [[0, 1, 2], [0, 1], [0]]
    approx = split_one_hop(edge_index, torch.arange(4), torch.zeros(4, dtype=torch.long), 1, hop=hop)[0]
    assert approx.layer_edge_index(2, 3) is approx.edge_index


def test_parts_built_one_at_a_time_in_any_order_equal_the_whole_split():
    from lightning_granndis.graph.one_hop import OneHopSplit

    edge_index, _ = random_graph(seed=3)
    owner = torch.randint(0, 4, (300,), generator=torch.Generator().manual_seed(3))
    whole = split_one_hop(edge_index, torch.arange(300), owner, 4)
    split = OneHopSplit(edge_index, torch.arange(300), owner, 4)
    for p in (3, 1, 0, 2):
        g = split.graph(p)
        for name in ("n_id", "edge_index", "send_index", "hop", "seed"):
            assert torch.equal(getattr(g, name), getattr(whole[p], name))
        assert (g.send_splits, g.recv_splits, g.n_owned) == (whole[p].send_splits, whole[p].recv_splits, whole[p].n_owned)
