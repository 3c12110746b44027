import pytest
import torch
from torch_geometric.utils import k_hop_subgraph

from lightning_granndis.datamodules.synthetic import PRESETS, generate
from lightning_granndis.graph.sampling import CSRGraph, NeighborSampler, sample_subgraph


@pytest.fixture(scope="module")
def graph():
    g = generate(PRESETS["tiny"])
    ei = torch.as_tensor(g["edge"]).t()
    ei = torch.unique(torch.cat([ei, ei.flip(0)], 1), dim=1)  # undirected
    n = PRESETS["tiny"].num_nodes
    return ei, n, CSRGraph.from_edge_index(ei, n)


def edges_of(ei):
    return set(map(tuple, ei.t().tolist()))


def test_full_fanout_equals_k_hop_subgraph(graph):
    ei, n, csr = graph
    seeds = torch.tensor([3, 50, 999])
    s = sample_subgraph(csr, seeds, [-1, -1], induced=True)
    subset, sub_ei, _, _ = k_hop_subgraph(seeds, 2, ei, num_nodes=n)
    assert set(s.n_id.tolist()) == set(subset.tolist())
    assert edges_of(s.n_id[s.edge_index]) == edges_of(sub_ei)
    assert s.edge_index.shape[1] == sub_ei.shape[1]  # no edge twice


def test_induced_when_the_frontier_empties_early_and_with_sampled_hops():
    # a path 0-1-2 and an isolated pair 3-4: 3 hops from 3 run out after one
    ei = torch.tensor([[0, 1, 1, 2, 3, 4], [1, 0, 2, 1, 4, 3]])
    csr = CSRGraph.from_edge_index(ei, 5)
    for fanouts in ([-1, -1, -1], [1, -1, 2]):
        s = sample_subgraph(csr, torch.tensor([3]), fanouts, induced=True, generator=torch.Generator().manual_seed(0))
        assert sorted(s.n_id.tolist()) == [3, 4]
        assert sorted(map(tuple, s.n_id[s.edge_index].t().tolist())) == [(3, 4), (4, 3)]
    s = sample_subgraph(csr, torch.tensor([0]), [1, 1], induced=True, generator=torch.Generator().manual_seed(0))
    assert sorted(map(tuple, s.n_id[s.edge_index].t().tolist())) == [(0, 1), (1, 0), (1, 2), (2, 1)]


def test_sampled_edges_exist_fanout_respected_and_hops_correct(graph):
    ei, n, csr = graph
    seeds = torch.arange(0, 200, 7)
    s = sample_subgraph(csr, seeds, [4, 3], generator=torch.Generator().manual_seed(1))
    real = edges_of(ei)
    glob = s.n_id[s.edge_index]
    assert all(e in real for e in edges_of(glob))
    indeg = torch.bincount(s.edge_index[1], minlength=s.num_nodes)
    deg = csr.degree[s.n_id]
    assert torch.all(indeg[s.hop == 0] == torch.clamp(deg[s.hop == 0], max=4))
    assert torch.all(indeg[s.hop == 1] <= 3) and torch.all(indeg[s.hop == 2] == 0)
    assert torch.equal(s.n_id[s.seed_mask], seeds) and torch.all(s.hop[s.seed_mask] == 0)
    # hop = shortest distance from the seeds within the sampled edges
    dist = torch.full((s.num_nodes,), -1)
    dist[s.seed_mask] = 0
    for h in (1, 2):
        src, dst = s.edge_index
        reach = src[(dist[dst] == h - 1) & (dist[src] < 0)]
        dist[reach] = h
    assert torch.equal(dist, s.hop)
    assert len(torch.unique(s.n_id)) == len(s.n_id)


def test_inside_edges_are_all_kept_and_only_leaving_edges_sampled(graph):
    ei, n, csr = graph
    inside = torch.zeros(n, dtype=torch.bool)
    inside[:1000] = True
    seeds = torch.arange(0, 1000, 50)
    s = sample_subgraph(csr, seeds, [2], inside=inside, generator=torch.Generator().manual_seed(0))
    src, dst = s.n_id[s.edge_index]
    for v in seeds.tolist():
        nbrs = csr.col[csr.rowptr[v]:csr.rowptr[v + 1]]
        got = src[dst == v]
        assert set(nbrs[inside[nbrs]].tolist()) <= set(got.tolist())  # every inside edge kept
        assert int((~inside[got]).sum()) == min(2, int((~inside[nbrs]).sum()))  # fan-out on leaving edges


def test_degree_weighted_choice_prefers_high_degree_neighbours(graph):
    ei, n, csr = graph
    seeds = torch.nonzero(csr.degree > 30).flatten()[:40]
    g = torch.Generator().manual_seed(0)
    mean_deg = {}
    for weighted in (False, True):
        degs = []
        for _ in range(5):
            s = sample_subgraph(csr, seeds, [3], weighted=weighted, generator=g)
            degs.append(csr.degree[s.n_id[s.edge_index[0]]].double().mean())
        mean_deg[weighted] = torch.stack(degs).mean()
    assert mean_deg[True] > 1.3 * mean_deg[False]


def test_neighbor_sampler_batches_cover_the_seeds_once(graph):
    from torch_geometric.data import Data

    ei, n, _ = graph
    train = torch.zeros(n, dtype=torch.bool)
    train[::3] = True
    data = Data(x=torch.randn(n, 4), y=torch.arange(n), edge_index=ei, train_mask=train, num_nodes=n)
    loader = NeighborSampler(data, [5, 5], batch_size=100)
    batches = list(loader)
    assert len(batches) == len(loader) == 7
    seen = torch.cat([b.n_id[b.seed_mask] for b in batches])
    assert torch.equal(torch.sort(seen).values, train.nonzero().flatten())
    assert all(torch.equal(b.y, b.n_id) and b.x.shape[0] == b.num_nodes for b in batches)
