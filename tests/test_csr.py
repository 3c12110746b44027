"""CSR from an edge list by an in-place key sort: the same rows as argsort/unique, in chunks."""

import torch

from lightning_granndis.graph.csr import csr_from_sorted_keys, sorted_keys
from lightning_granndis.graph.partition import to_csr
from lightning_granndis.graph.sampling import CSRGraph


def random_edges(n=400, e=5000, seed=0):
    g = torch.Generator().manual_seed(seed)
    edges = torch.randint(0, n, (2, e), generator=g)
    loops = torch.arange(0, n, 7).repeat(2, 1)  # self loops and duplicates on purpose
    return torch.cat([edges, loops, edges[:, :300]], 1)


def test_to_csr_is_the_symmetric_loop_free_deduplicated_graph():
    n, ei = 400, random_edges()
    rowptr, col = to_csr(ei, n)
    keep = ei[0] != ei[1]
    both = torch.cat([ei[:, keep], ei[:, keep].flip(0)], 1)
    key = torch.unique(both[0] * n + both[1])
    expected_rowptr = torch.zeros(n + 1, dtype=torch.long)
    expected_rowptr[1:] = torch.cumsum(torch.bincount(key // n, minlength=n), 0)
    assert torch.equal(rowptr, expected_rowptr) and torch.equal(col, key % n)


def test_in_neighbour_csr_keeps_every_edge_sorted_by_target_then_source():
    n, ei = 400, random_edges(seed=1)
    csr = CSRGraph.from_edge_index(ei, n)
    src, dst = ei
    order = torch.argsort(dst * n + src)
    assert torch.equal(csr.col, src[order])
    assert torch.equal(csr.degree, torch.bincount(dst, minlength=n))


def test_chunked_fill_equals_one_chunk_and_int32_input_does_not_overflow():
    n, ei = 400, random_edges(seed=2)
    whole = sorted_keys(ei[0], ei[1], n, symmetric=True, drop_loops=True)
    chunked = sorted_keys(ei[0], ei[1], n, symmetric=True, drop_loops=True, chunk=97)
    assert (whole == chunked).all()
    big = 3_000_000  # N^2 overflows int32
    pair = torch.tensor([[big - 1, 0], [big - 2, big - 1]], dtype=torch.int32)
    rowptr, col = csr_from_sorted_keys(sorted_keys(pair[0], pair[1], big), big)
    assert col.tolist() == [big - 1, big - 2] and int(rowptr[big - 1]) == 1


def test_empty_graph():
    rowptr, col = to_csr(torch.empty(2, 0, dtype=torch.long), 5)
    assert rowptr.tolist() == [0] * 6 and col.numel() == 0
