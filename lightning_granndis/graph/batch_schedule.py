"""Which training seeds each step of a sampled epoch trains on, as PyG + DDP users count them.

A PyG user under DDP shuffles the training seeds with Lightning's ``DistributedSampler`` (every
rank the same permutation, rank ``r`` taking positions ``r, r + P, r + 2P, ...``) and cuts the
rank's share into ``NeighborLoader`` batches of ``batch_size``. Step ``k`` then covers positions
``[k P B, (k + 1) P B)`` of the permutation, rank ``r`` the ones congruent to ``r`` mod ``P``; an
epoch has ``ceil(N / (P B))`` steps, the last one partial unless ``drop_last``. MB_base deals its
seeds exactly so (without the sampler's padding: a rank short of seeds in the last step weighs
its loss by what it has).

A CoB co-batch is ``G B`` seeds of one server (``G`` devices): server ``s`` cuts its own shuffled
seeds into co-batches of ``G B``; every server runs the same number of steps (collectives line
up), ``ceil(max_s N_s / (G B))``, which is PyG + DDP's count whenever the server split balances
the training seeds (METIS balances them); a server that runs out early trains an empty co-batch
(loss weight 0). ``iterations`` (the artifact's ``--epoch-iter``) instead cuts every seed set
into that many near-equal batches.
"""

from __future__ import annotations

import math

import torch


def check_batch_size(batch_size, iterations=None) -> None:
    """Refuses a batch size or iteration count that cannot make batches, naming the fix."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int (seeds per rank per step, as NeighborLoader's "
                         f"batch_size under DDP), got {batch_size!r}.")
    if iterations is not None and (isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1):
        raise ValueError(f"iterations must be a positive int (batches per epoch) or None, got {iterations!r}.")


def steps_per_epoch(seed_counts: list[int], per_step: int, drop_last: bool = False,
                    iterations: int | None = None) -> int:
    """Steps of an epoch when each of the seed sets ``seed_counts`` (one for MB_base's whole
    training set, one per server for CoB) is cut into batches of ``per_step`` seeds; the longest
    set decides (``drop_last``: the shortest, full batches only); ``iterations`` overrides."""
    if iterations is not None:
        return int(iterations)
    if drop_last:
        return min(seed_counts, default=0) // per_step
    return max(1, math.ceil(max(seed_counts, default=0) / per_step))


def batch_bounds(count: int, per_step: int, steps: int, iterations: int | None = None) -> list[tuple[int, int]]:
    """``(start, end)`` of each step's slice of a shuffled set of ``count`` seeds (empty past
    its end); with ``iterations``, ``torch.tensor_split``'s near-equal cut into that many."""
    if iterations is not None:
        sizes = [count // iterations + (1 if i < count % iterations else 0) for i in range(iterations)]
        starts = [sum(sizes[:i]) for i in range(iterations)]
        return [(s, s + n) for s, n in zip(starts, sizes)]
    return [(min(count, k * per_step), min(count, (k + 1) * per_step)) for k in range(steps)]


def step_totals(seed_counts: list[int], per_step: int, steps: int, iterations: int | None = None) -> list[int]:
    """Seeds every step trains on over all ranks: each step's loss weights follow from them
    without communication."""
    bounds = [batch_bounds(c, per_step, steps, iterations) for c in seed_counts]
    return [sum(end - start for start, end in step) for step in zip(*bounds)]


def dealt_to_rank(global_batch: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s seeds of one global batch, as ``DistributedSampler`` deals them."""
    return global_batch[rank::world_size]


def describe(steps: int, seeds: int, world_size: int, batch_size: int, drop_last: bool,
             co_batch: int | None = None) -> str:
    """The epoch's step count, and PyG + DDP's for the same settings where they differ."""
    pyg = seeds // (world_size * batch_size) if drop_last else math.ceil(seeds / (world_size * batch_size))
    per = (f"co-batches of {co_batch} seeds per server" if co_batch else
           f"{batch_size} seeds per rank, global batch {world_size * batch_size}")
    text = f"{steps} steps per epoch ({seeds:,} training seeds, {per}{', drop_last' if drop_last else ''})"
    if steps != pyg:
        text += (f"; PyG + DDP would take {pyg}: the server split holds unequal seed counts and every "
                 "server runs the longest one's co-batches")
    return text
