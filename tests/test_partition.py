import pytest
import torch

from lightning_granndis.datamodules.synthetic import PRESETS, generate
from lightning_granndis.graph.partition import metis_partition, random_partition


@pytest.fixture(scope="module")
def graph():
    g = generate(PRESETS["tiny"])
    ei = torch.as_tensor(g["edge"]).t()
    train = torch.zeros(PRESETS["tiny"].num_nodes, dtype=torch.bool)
    train[torch.as_tensor(g["train"])] = True
    return ei, PRESETS["tiny"].num_nodes, train


@pytest.mark.parametrize("parts", [2, 4])
def test_metis_is_balanced_and_cuts_far_fewer_edges_than_random(graph, parts):
    ei, n, train = graph
    m = metis_partition(ei, n, parts, train_mask=train)
    r = random_partition(ei, n, parts, train_mask=train)
    assert m.assignment.shape == (n,) and set(m.assignment.unique().tolist()) == set(range(parts))
    assert m.balance < 1.1 and m.train_balance < 1.1
    assert m.edge_cut < 0.5 * r.edge_cut
    assert r.num_edges == m.num_edges and r.balance == pytest.approx(1.0, abs=1e-3)
    # the reported cut is the real one
    a = m.assignment
    sym = torch.cat([ei, ei.flip(0)], 1)
    sym = sym[:, sym[0] != sym[1]]
    pairs = torch.unique(sym[0] * n + sym[1])
    assert m.edge_cut == int((a[pairs // n] != a[pairs % n]).sum()) // 2


def test_cache_is_keyed_by_content_and_parameters(graph, tmp_path):
    ei, n, train = graph
    a = metis_partition(ei, n, 4, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("metis-*.pt"))) == 1
    b = metis_partition(ei, n, 4, cache_dir=tmp_path)
    assert torch.equal(a.assignment, b.assignment)
    metis_partition(ei, n, 2, cache_dir=tmp_path)
    metis_partition(ei[:, :-10], n, 4, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("metis-*.pt"))) == 3
