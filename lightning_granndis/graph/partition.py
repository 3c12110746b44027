"""Graph partitioning: METIS (through ``pymetis``) and random, with edge cut and balance.

GraNNDis (PACT'24, §5.3.1) dedicates each server to the inner vertices of a METIS min-cut part,
and splits a server's subgraph across its devices with METIS again (§6). The edge cut is what
crosses the slow link, so it is reported beside a random partition's.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from lightning_granndis.graph.csr import csr_from_sorted_keys, sorted_keys


@dataclass(frozen=True)
class Partition:
    """A vertex → part assignment with its quality.

    Attributes:
        assignment: ``[N]`` long tensor of part ids.
        num_parts: number of parts.
        edge_cut: undirected edges whose ends lie in different parts.
        num_edges: undirected edges in the graph.
        balance: largest part's vertex count over the mean (1.0 = perfect).
        train_balance: the same for training vertices, when a mask was given (else ``None``).
        method: ``"metis"`` or ``"random"``.
    """

    assignment: torch.Tensor
    num_parts: int
    edge_cut: int
    num_edges: int
    balance: float
    train_balance: float | None
    method: str

    @property
    def cut_fraction(self) -> float:
        return self.edge_cut / max(1, self.num_edges)

    def part(self, k: int) -> torch.Tensor:
        """Vertex ids of part ``k``."""
        return (self.assignment == k).nonzero().flatten()

    def describe(self) -> str:
        text = (f"{self.method}, {self.num_parts} parts: edge cut {self.edge_cut:,} of {self.num_edges:,} "
                f"({100 * self.cut_fraction:.1f}%), vertex balance {self.balance:.3f}")
        if self.train_balance is not None:
            text += f", train balance {self.train_balance:.3f}"
        return text


def to_csr(edge_index: torch.Tensor, num_nodes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric, self-loop-free, de-duplicated CSR ``(rowptr [N+1], col [nnz])``."""
    row, col = edge_index
    return csr_from_sorted_keys(sorted_keys(row, col, num_nodes, symmetric=True, drop_loops=True), num_nodes,
                                unique=True)


def _quality(assignment: torch.Tensor, csr: tuple[torch.Tensor, torch.Tensor], num_nodes: int, num_parts: int,
             train_mask: torch.Tensor | None, method: str, chunk: int = 2**18) -> Partition:
    rowptr, col = csr
    cut = 0
    for v0 in range(0, num_nodes, chunk):  # by vertex ranges: no nnz-sized row index
        v1 = min(num_nodes, v0 + chunk)
        lo, hi = int(rowptr[v0]), int(rowptr[v1])
        row = torch.repeat_interleave(assignment[v0:v1], rowptr[v0 + 1:v1 + 1] - rowptr[v0:v1])
        cut += int((row != assignment[col[lo:hi]]).sum())
    cut //= 2
    sizes = torch.bincount(assignment, minlength=num_parts).double()
    train_balance = None
    if train_mask is not None:
        t = torch.bincount(assignment[train_mask], minlength=num_parts).double()
        train_balance = float(t.max() / t.mean())
    return Partition(assignment, num_parts, cut, len(col) // 2, float(sizes.max() / sizes.mean()), train_balance,
                     method)


def _cache_key(edge_index: torch.Tensor, num_nodes: int, num_parts: int, train_mask, seed: int) -> str:
    h = hashlib.sha256()
    h.update(edge_index.contiguous().numpy().tobytes())
    h.update(f"{num_nodes}/{num_parts}/{seed}".encode())
    if train_mask is not None:
        h.update(train_mask.numpy().tobytes())
    return h.hexdigest()[:24]


def metis_partition(
    edge_index: torch.Tensor,
    num_nodes: int,
    num_parts: int,
    train_mask: torch.Tensor | None = None,
    seed: int = 0,
    cache_dir: str | os.PathLike | None = None,
) -> Partition:
    """METIS k-way min-cut partition balanced on vertices (and on training vertices when
    ``train_mask`` is given: a second balance constraint, so every part gets its share of seeds).

    Args:
        edge_index: ``[2, E]`` (either direction; made symmetric).
        num_nodes: vertices.
        num_parts: parts (servers or devices).
        train_mask: ``[N]`` bool, optional second balance constraint.
        seed: METIS' random seed.
        cache_dir: where to cache results, keyed by graph content and parameters.
    """
    if num_parts < 1:
        raise ValueError(f"num_parts must be at least 1, got {num_parts}.")
    csr = to_csr(edge_index, num_nodes)
    if num_parts == 1:
        return _quality(torch.zeros(num_nodes, dtype=torch.long), csr, num_nodes, 1, train_mask, "metis")
    cache = None
    if cache_dir is not None:
        cache = Path(cache_dir) / f"metis-{_cache_key(edge_index, num_nodes, num_parts, train_mask, seed)}.pt"
        if cache.exists():
            assignment = torch.load(cache, weights_only=True)
            return _quality(assignment, csr, num_nodes, num_parts, train_mask, "metis")
    import pymetis

    rowptr, col = csr
    options = pymetis.Options(seed=seed)
    vweights = None
    if train_mask is not None:
        # two constraints per vertex: (1, is_train), interleaved as METIS expects
        vweights = torch.stack([torch.ones(num_nodes, dtype=torch.long), train_mask.long()], 1).flatten().tolist()
    adjacency = pymetis.CSRAdjacency(rowptr.numpy(), col.numpy())
    _, parts = pymetis.part_graph(num_parts, adjacency=adjacency, vweights=vweights, options=options)
    assignment = torch.as_tensor(parts, dtype=torch.long)
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".tmp{os.getpid()}")
        torch.save(assignment, tmp)
        os.replace(tmp, cache)
    return _quality(assignment, csr, num_nodes, num_parts, train_mask, "metis")


def random_partition(edge_index: torch.Tensor, num_nodes: int, num_parts: int,
                     train_mask: torch.Tensor | None = None, seed: int = 0) -> Partition:
    """Vertices dealt to parts uniformly at random (equal sizes): the baseline for edge cut."""
    g = torch.Generator().manual_seed(seed)
    assignment = torch.empty(num_nodes, dtype=torch.long)
    assignment[torch.randperm(num_nodes, generator=g)] = torch.arange(num_nodes) % num_parts
    return _quality(assignment, to_csr(edge_index, num_nodes), num_nodes, num_parts, train_mask, "random")
