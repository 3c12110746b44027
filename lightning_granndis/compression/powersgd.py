"""Data-parallel gradient averaging with PowerSGD (Vogels et al., `PowerSGD: Practical Low-Rank
Gradient Compression for Distributed Optimization <https://arxiv.org/abs/1905.13175>`_, NeurIPS'19),
as Optimus-CC uses it for the stages on the critical path (Selective Compression).

Each matrix gradient :math:`G_i` (rank :math:`i` of ``D`` replicas, error :math:`e_i` added) becomes

.. math::
    M_i = G_i + e_i,\\quad P = \\mathrm{orth}\\Big(\\tfrac1D\\sum_i M_i Q\\Big),\\quad
    Q = \\tfrac1D\\sum_i M_i^\\top P,\\quad \\bar G = P Q^\\top,\\quad e_i \\leftarrow M_i - \\bar G,

two all-reduces of ``(n + m) r`` numbers instead of one of ``n m``; ``Q`` is warm-started from the
previous step. Vectors, and matrices too small to gain, are averaged exactly.
"""

from __future__ import annotations

from typing import Sequence

import torch

from lightning_granndis.comm import Communicator
from lightning_granndis.compression.low_rank import as_matrix, low_rank_pays, orthogonalise


class PowerSGDReducer:
    """Averages gradients over a data-parallel group, low-rank where it pays.

    Args:
        rank: rank ``r`` of the factors (default 4).
        error_feedback: carry each replica's residual into its next step (default ``True``).
        warmup_steps: average exactly for this many first calls (default 0).
        seed: seed of the first ``Q`` (the same on every replica).
    """

    def __init__(self, rank: int = 4, error_feedback: bool = True, warmup_steps: int = 0, seed: int = 0) -> None:
        if rank < 1:
            raise ValueError(f"PowerSGD rank must be at least 1, got {rank}.")
        self.rank, self.error_feedback, self.warmup_steps, self.seed = rank, error_feedback, warmup_steps, seed
        self.steps = 0
        self.q: dict[int, torch.Tensor] = {}
        self.error: dict[int, torch.Tensor] = {}

    def reduce(self, grads: Sequence[torch.Tensor], comm: Communicator, group, replicas: int,
               purpose: str = "grad_sync") -> None:
        """Replaces every tensor of ``grads`` (in place) by its average over ``group``."""
        compress = self.steps >= self.warmup_steps
        self.steps += 1
        exact = [g for g in grads if not (compress and low_rank_pays(g.shape, self.rank))]
        low = [(i, g) for i, g in enumerate(grads) if compress and low_rank_pays(g.shape, self.rank)]
        if exact:
            all_reduce_flat(exact, comm, group, replicas, purpose)
        if not low:
            return
        mats = []
        for i, g in low:
            m = as_matrix(g).float()
            if self.error_feedback and i in self.error:
                m = m + self.error[i]
            mats.append(m)
        qs = []
        for (i, _), m in zip(low, mats):
            r = min(*m.shape, self.rank)
            if i not in self.q or self.q[i].shape != (m.shape[1], r):
                gen = torch.Generator(device="cpu").manual_seed(self.seed + i)
                self.q[i] = torch.randn(m.shape[1], r, generator=gen).to(m.device)
            qs.append(orthogonalise(self.q[i]))
        ps = [m @ q for m, q in zip(mats, qs)]
        flat_p = torch.cat([p.reshape(-1) for p in ps]).div_(replicas)
        comm.all_reduce(flat_p, purpose, group=group)
        ps = [orthogonalise(chunk.view_as(p)) for chunk, p in zip(_split(flat_p, ps), ps)]
        new_q = [m.T @ p for m, p in zip(mats, ps)]
        flat_q = torch.cat([q.reshape(-1) for q in new_q]).div_(replicas)
        comm.all_reduce(flat_q, purpose, group=group)
        for (i, g), m, p, chunk, q in zip(low, mats, ps, _split(flat_q, new_q), new_q):
            q = chunk.view_as(q)
            self.q[i] = q.clone()
            approx = p @ q.T
            if self.error_feedback:
                self.error[i] = m - approx
            g.copy_(approx.view_as(g).to(g.dtype))

    def state_dict(self) -> dict:
        return {"steps": self.steps, "q": {str(k): v for k, v in self.q.items()},
                "error": {str(k): v for k, v in self.error.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.steps = int(state["steps"])
        self.q = {int(k): v for k, v in state["q"].items()}
        self.error = {int(k): v for k, v in state["error"].items()}


def _split(flat: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    out, offset = [], 0
    for t in like:
        out.append(flat[offset:offset + t.numel()])
        offset += t.numel()
    return out


def all_reduce_flat(tensors: Sequence[torch.Tensor], comm: Communicator, group, divide: int = 1,
                    purpose: str = "grad_sync") -> None:
    """Sums ``tensors`` over ``group`` in one flat all-reduce, divided by ``divide``, in place."""
    flat = torch.cat([t.reshape(-1) for t in tensors])
    if divide != 1:
        flat.div_(divide)
    comm.all_reduce(flat, purpose, group=group)
    for t, chunk in zip(tensors, _split(flat, tensors)):
        t.copy_(chunk.view_as(t))
