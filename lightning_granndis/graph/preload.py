"""Flexible Preloading: the vertices a server's inner vertices depend on, and per-layer exactness.

GraNNDis (PACT'24, §5.1): each server replicates every vertex its inner vertices depend on within
``L`` hops (``L`` message-passing layers), so forward and backward need no inter-server feature or
embedding traffic. A preloaded vertex at hop distance ``h`` from the inner set sees all its
neighbours only while ``h < L``; after ``l`` layers its representation is exact iff ``h <= L - l``
(One-Hop Graph Masking, §6, zeroes the others so errors never spread).
"""

from __future__ import annotations

import torch

from lightning_granndis.graph.sampling import CSRGraph


def preload_dependencies(graph: CSRGraph, inner: torch.Tensor, hops: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``hops``-hop in-neighbourhood closure of ``inner``.

    Args:
        graph: the whole graph (in-neighbour CSR).
        inner: ``[S]`` ids of the server's inner vertices.
        hops: number of message-passing layers ``L``.

    Returns:
        ``(vertices, hop)``: ``[n]`` global ids, inner vertices first (in the given order), then by
        increasing hop distance; and ``[n]`` hop distance from the inner set.
    """
    n = graph.num_nodes
    dist = torch.full((n,), -1, dtype=torch.long)
    dist[inner] = 0
    layers, frontier = [inner], inner
    for h in range(1, hops + 1):
        if frontier.numel() == 0:
            break
        reached = torch.zeros(n, dtype=torch.bool)
        for part in graph.vertex_chunks(frontier):  # bounded gathers on a large frontier
            reached[graph.neighbours(part)[1]] = True
        new = (reached & (dist < 0)).nonzero().flatten()  # ascending, as torch.unique's
        dist[new] = h
        layers.append(new)
        frontier = new
    vertices = torch.cat(layers)
    return vertices, dist[vertices]


def exactness_masks(hop: torch.Tensor, num_layers: int) -> list[torch.Tensor]:
    """``masks[l]`` (``l = 1..L``, index ``l - 1``): vertices whose output of layer ``l`` is *not*
    exact (``hop > L - l``) and must be zeroed. ``masks[L-1]`` keeps only the inner vertices."""
    return [hop > num_layers - layer for layer in range(1, num_layers + 1)]
