"""Fetching remote input features for per-device mini-batches (the MB_base baseline).

Features are partitioned across ranks (each owns its METIS part's rows, as SALIENT++ and DistDGL
partition them); a mini-batch's input vertices owned elsewhere are requested from their owners
every iteration: the ids go out in one all-to-all, the rows come back in another.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class FetchRequest:
    """What one rank asks of its peers for one mini-batch.

    Attributes:
        ids: global ids requested, grouped by owning rank.
        splits: ids asked of each rank (``0`` of itself).
        pos: the batch rows the answers fill, in the same order.
    """

    ids: torch.Tensor
    splits: list[int]
    pos: torch.Tensor


def fetch_request(n_id: torch.Tensor, owner: torch.Tensor, rank: int, world_size: int) -> FetchRequest:
    """The request for a batch whose rows are vertices ``n_id`` owned by ranks ``owner``."""
    pos = (owner != rank).nonzero().flatten()
    pos = pos[torch.sort(owner[pos], stable=True).indices]
    return FetchRequest(n_id[pos], torch.bincount(owner[pos], minlength=world_size).tolist(), pos)
