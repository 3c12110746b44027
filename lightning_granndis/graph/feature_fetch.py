"""Fetching remote input features for per-device mini-batches (the MB_base baseline).

Features are partitioned across ranks (each owns its METIS part's rows, as SALIENT++ and DistDGL
partition them); a mini-batch's input vertices owned elsewhere are fetched with one all-to-all per
iteration. The plans are computed once, for every rank and iteration together, so the sends and
receives of each pair of ranks line up.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class FetchPlan:
    """One rank's side of one iteration's feature fetch.

    Attributes:
        send_ids: global ids this rank serves, grouped by requesting rank.
        send_splits: rows sent to each rank.
        recv_splits: rows received from each rank.
        recv_pos: the batch rows the received rows fill, in arrival order.
    """

    send_ids: torch.Tensor
    send_splits: list[int]
    recv_splits: list[int]
    recv_pos: torch.Tensor


def fetch_plans(needed: list[torch.Tensor], owner_of: torch.Tensor) -> list[FetchPlan]:
    """``needed[r]``: the global ids of rank ``r``'s batch rows; ``owner_of``: ``[N]`` rank owning
    each vertex's features. Returns one :class:`FetchPlan` per rank."""
    P = len(needed)
    requests = []  # requests[r][q]: ids rank r asks of rank q, in r's row order
    plans_pos, recv_splits = [], []
    for r, ids in enumerate(needed):
        owner = owner_of[ids]
        pos = (owner != r).nonzero().flatten()
        pos = pos[torch.sort(owner[pos], stable=True).indices]
        plans_pos.append(pos)
        recv_splits.append(torch.bincount(owner[pos], minlength=P).tolist())
        requests.append([ids[pos][owner[pos] == q] for q in range(P)])
    plans = []
    for q in range(P):
        send = [requests[r][q] for r in range(P)]
        plans.append(FetchPlan(torch.cat(send), [int(s.numel()) for s in send], recv_splits[q], plans_pos[q]))
    return plans
