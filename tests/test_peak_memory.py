import torch

from lightning_granndis.callbacks.peak_memory import PeakMemory


def test_activations_saved_by_sparse_aggregation_are_counted_once():
    """Autograd saves a sparse CSR adjacency for ``torch.sparse.mm`` (PyG's sparse path): it has no
    storage of its own, so its index and value arrays are what is counted."""
    adj = torch.eye(8).to_sparse_csr()
    x = torch.randn(8, 4, requires_grad=True)
    cb = PeakMemory()
    with torch.autograd.graph.saved_tensors_hooks(cb._pack, lambda t: t):
        out = torch.sparse.mm(adj, x)
        out2 = torch.sparse.mm(adj, x)  # the same tensors again: not counted twice
    (out + out2).sum().backward()
    sparse_bytes = sum(t.numel() * t.element_size() for t in (adj.crow_indices(), adj.col_indices(), adj.values()))
    assert cb._step_bytes >= sparse_bytes
    assert cb._step_bytes <= sparse_bytes + x.numel() * x.element_size()
