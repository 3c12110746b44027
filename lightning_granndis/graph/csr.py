"""Compressed sparse rows from an edge list, within a graph's own size.

A CSR is a sort of the edges by ``row * N + col``. ``torch.argsort`` (or ``torch.unique``) of those
keys allocates an index array and scratch of the keys' size beside them; at ogbn-products size
(123M edges) that made building the symmetric CSR METIS reads cost 13 GB. Sorting the ``int64``
keys in place with NumPy and decoding ``col`` in place keeps the cost to the keys themselves.
"""

from __future__ import annotations

import numpy as np
import torch


def sorted_keys(first: torch.Tensor, second: torch.Tensor, num_nodes: int, symmetric: bool = False,
                drop_loops: bool = False, chunk: int = 2**24) -> np.ndarray:
    """``first * N + second`` of every edge (and, with ``symmetric``, of its reverse), sorted in
    place: one ``int64`` per key and no index array, so a graph's CSR costs its ``col`` once more
    (``argsort`` or ``unique`` would also allocate indices and scratch of the same size)."""
    keep = (first != second) if drop_loops else None
    count = int(keep.sum()) if keep is not None else int(first.numel())
    keys = np.empty(count * (2 if symmetric else 1), dtype=np.int64)
    pos = 0
    for start in range(0, int(first.numel()), chunk):  # filled chunk-wise: no E-sized temporaries
        a, b = first[start:start + chunk], second[start:start + chunk]
        if keep is not None:
            k = keep[start:start + chunk]
            a, b = a[k], b[k]
        n = int(a.numel())
        keys[pos:pos + n] = (a.long() * num_nodes + b).numpy()
        if symmetric:
            keys[count + pos:count + pos + n] = (b.long() * num_nodes + a).numpy()
        pos += n
    keys.sort()
    return keys


def csr_from_sorted_keys(keys: np.ndarray, num_nodes: int, unique: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rowptr [N+1], col)`` from sorted ``row * N + col`` keys (de-duplicated with ``unique``);
    ``col`` reuses the keys' memory."""
    if unique and keys.size:
        fresh = np.empty(keys.size, dtype=bool)
        fresh[0] = True
        np.not_equal(keys[1:], keys[:-1], out=fresh[1:])
        keys = keys[fresh]
    rowptr = np.searchsorted(keys, np.arange(num_nodes + 1, dtype=np.int64) * num_nodes)
    np.remainder(keys, num_nodes, out=keys)
    return torch.from_numpy(rowptr), torch.from_numpy(keys)
