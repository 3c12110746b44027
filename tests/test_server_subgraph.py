"""Per-mode server subgraphs: FLX exact with masks across devices, EAS and CoB sampling rules."""

import torch
from torch_geometric.nn import SAGEConv

from lightning_granndis.graph.one_hop import simulate_exchange
from lightning_granndis.graph.plan import PlanConfig, build_plan, split_across_devices
from lightning_granndis.graph.sampling import CSRGraph
from lightning_granndis.graph.server_subgraph import expansion_subgraph, preloaded_subgraph, sampled_subgraph


def power_law_graph(n=400, e=3000, seed=0):
    g = torch.Generator().manual_seed(seed)
    weights = 1.0 / torch.arange(1, n + 1).float() ** 0.7
    src = torch.multinomial(weights, e, replacement=True, generator=g)
    dst = torch.randint(0, n, (e,), generator=g)
    keep = src != dst
    return torch.stack([src[keep], dst[keep]]), n


def test_flx_subgraph_split_across_devices_is_exact_for_inner_vertices():
    edge_index, n = power_law_graph()
    graph = CSRGraph.from_edge_index(edge_index, n)
    inner = torch.arange(0, n, 2)
    L = 3
    sub = preloaded_subgraph(graph, inner, L)
    assert torch.equal(sub.n_id[: inner.numel()], inner) and (sub.hop <= L).all()
    torch.manual_seed(0)
    layers = [SAGEConv(6, 6) for _ in range(L)]
    x = torch.randn(n, 6)
    full = x
    for layer in layers:
        full = layer(full, edge_index).relu()
    graphs = split_across_devices(sub, 2)
    h = [x[g.n_id[: g.n_owned]] for g in graphs]
    masks = [g.input_masks(L) for g in graphs]
    for k, layer in enumerate(layers):
        h = [hk.masked_fill(m[k].unsqueeze(1), 0) if m[k] is not None else hk for hk, m in zip(h, masks)]
        rows = simulate_exchange(graphs, h)
        h = [layer(r, g.edge_index)[: g.n_owned].relu() for g, r in zip(graphs, rows)]
    for g, out in zip(graphs, h):
        ids = g.n_id[: g.n_owned][g.seed]
        assert torch.allclose(out[g.seed], full[ids], atol=1e-5)
    assert sum(int(g.seed.sum()) for g in graphs) == inner.numel()


def test_eas_keeps_inner_edges_and_respects_fanout():
    edge_index, n = power_law_graph()
    graph = CSRGraph.from_edge_index(edge_index, n)
    inner = torch.arange(n // 2)
    fanout = 3
    sub = expansion_subgraph(graph, inner, hops=1, fanout=fanout, generator=torch.Generator().manual_seed(0))
    src, dst = sub.n_id[sub.edge_index[0]], sub.n_id[sub.edge_index[1]]
    is_inner = torch.zeros(n, dtype=torch.bool)
    is_inner[inner] = True
    # every edge among inner vertices is present
    wanted = edge_index[:, is_inner[edge_index[0]] & is_inner[edge_index[1]]]
    have = set((src * n + dst).tolist())
    assert set((wanted[0] * n + wanted[1]).tolist()) <= have
    # at most `fanout` distinct external neighbours per inner vertex
    ext = is_inner[dst] & ~is_inner[src]
    per_vertex = torch.bincount(dst[ext], minlength=n)
    assert int(per_vertex.max()) <= fanout
    assert int(per_vertex.max()) == fanout  # high-degree vertices do reach the cap
    assert sub.exact_hops is None and sub.seed.sum() == inner.numel()


def test_eas_degree_aware_prefers_high_degree_neighbours():
    edge_index, n = power_law_graph(n=2000, e=30000)
    graph = CSRGraph.from_edge_index(edge_index, n)
    inner = torch.arange(0, n, 2)
    deg = torch.bincount(edge_index.flatten(), minlength=n).float()
    mean_deg = {}
    for weighted in (True, False):
        sub = expansion_subgraph(graph, inner, 1, 2, weighted=weighted, generator=torch.Generator().manual_seed(0))
        mean_deg[weighted] = float(deg[sub.n_id[sub.hop == 1]].mean())
    assert mean_deg[True] > mean_deg[False]


def test_cob_co_batches_cover_training_seeds_once_per_epoch():
    edge_index, n = power_law_graph()
    from torch_geometric.data import Data

    train = torch.zeros(n, dtype=torch.bool)
    train[torch.arange(0, n, 3)] = True
    data = Data(edge_index=edge_index, num_nodes=n, train_mask=train)
    server_of = (torch.arange(n) >= n // 2).long()
    cfg = PlanConfig(mode="cob", servers=2, devices_per_server=2, hops=2, fanout=4, batch_size=10)
    plans = build_plan(data, cfg, server_of, progress=False)
    iterations = len(plans[0])
    assert all(len(p) == iterations for p in plans) and iterations == 4  # ceil(67 / 20)
    seeds = torch.cat([g.n_id[: g.n_owned][g.seed] for p in plans for g in p])
    assert torch.equal(torch.sort(seeds).values, train.nonzero().flatten())
    sub = sampled_subgraph(CSRGraph.from_edge_index(edge_index, n), torch.tensor([1, 2, 3]), fanout=4, hops=2)
    in_edges = torch.bincount(sub.edge_index[1], minlength=sub.num_nodes)
    assert int(in_edges.max()) <= 4 and sub.exact_hops == 2
