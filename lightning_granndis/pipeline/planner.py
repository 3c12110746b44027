"""Stage planning: contiguous block ranges per pipeline stage, and stage placement on servers.

Splitting (cf. Luo et al., `Efficient Pipeline Planning for Expedited Distributed DNN Training
<https://arxiv.org/abs/2204.10562>`_): blocks ``0..B-1`` with profiled costs :math:`c_b` and
memory :math:`m_b` go to ``S`` stages of consecutive blocks, minimising the bottleneck stage
:math:`\\max_s \\sum_{b \\in s} c_b` subject to :math:`\\sum_{b \\in s} m_b \\le` ``memory_cap``,
by dynamic programming over (stages used, blocks covered): :math:`O(S B^2)`.

Placement: with ``P = DP x PP`` ranks, each pipeline replica is a chain of ``PP`` ranks. Putting a
replica's stages on consecutive ranks keeps its boundaries inside servers wherever possible; the
planner reports which boundaries still cross servers (those are the ones worth compressing).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from lightning_granndis.topology import ServerTopology


@dataclass(frozen=True)
class StagePlan:
    """``balance[s]`` blocks in stage ``s``; the cost and memory of each stage; the bottleneck."""

    balance: tuple[int, ...]
    stage_costs: tuple[float, ...]
    stage_memory: tuple[float, ...]

    @property
    def bottleneck(self) -> float:
        return max(self.stage_costs)

    def blocks(self, stage: int) -> range:
        start = sum(self.balance[:stage])
        return range(start, start + self.balance[stage])


def _plan(balance: Sequence[int], costs: Sequence[float], memory: Sequence[float]) -> StagePlan:
    out_c, out_m, start = [], [], 0
    for n in balance:
        out_c.append(float(sum(costs[start:start + n])))
        out_m.append(float(sum(memory[start:start + n])))
        start += n
    return StagePlan(tuple(balance), tuple(out_c), tuple(out_m))


def check_balance(balance: Sequence[int], num_blocks: int, stages: int) -> tuple[int, ...]:
    """A manual ``balance``: one positive count per stage, summing to the number of blocks."""
    balance = tuple(int(b) for b in balance)
    if len(balance) != stages or any(b < 1 for b in balance) or sum(balance) != num_blocks:
        raise ValueError(
            f"balance={list(balance)} must give each of the {stages} stages at least one block and cover all "
            f"{num_blocks} blocks (it sums to {sum(balance)})."
        )
    return balance


def plan_stages(costs: Sequence[float], stages: int, memory: Sequence[float] | None = None,
                memory_cap: float | None = None, balance: Sequence[int] | None = None) -> StagePlan:
    """Contiguous split of blocks into ``stages`` minimising the bottleneck under ``memory_cap``.

    Args:
        costs: ``[B]`` profiled time of each block (forward + backward).
        stages: number of pipeline stages ``S`` (``1 <= S <= B``).
        memory: ``[B]`` memory of each block (default zeros).
        memory_cap: the most memory one stage may hold (default unlimited).
        balance: a manual split instead of the search (validated).

    Raises:
        ValueError: ``S`` out of range, or no split fits ``memory_cap``.
    """
    B = len(costs)
    memory = list(memory) if memory is not None else [0.0] * B
    if not 1 <= stages <= B:
        raise ValueError(f"cannot split {B} blocks into {stages} stages: need 1 <= stages <= {B}.")
    if balance is not None:
        return _plan(check_balance(balance, B, stages), costs, memory)
    cap = math.inf if memory_cap is None else memory_cap
    prefix_c, prefix_m = [0.0], [0.0]
    for c, m in zip(costs, memory):
        prefix_c.append(prefix_c[-1] + c)
        prefix_m.append(prefix_m[-1] + m)
    INF = math.inf
    # best[s][j]: smallest bottleneck covering blocks [0, j) with s stages; cut[s][j]: start of the last
    best = [[INF] * (B + 1) for _ in range(stages + 1)]
    cut = [[-1] * (B + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for s in range(1, stages + 1):
        for j in range(s, B - (stages - s) + 1):
            for i in range(s - 1, j):
                if best[s - 1][i] == INF or prefix_m[j] - prefix_m[i] > cap:
                    continue
                value = max(best[s - 1][i], prefix_c[j] - prefix_c[i])
                if value < best[s][j]:
                    best[s][j], cut[s][j] = value, i
    if best[stages][B] == INF:
        raise ValueError(
            f"no split of {B} blocks into {stages} stages keeps every stage under memory_cap={memory_cap}; "
            "use more stages, raise the cap, or shrink the micro-batch."
        )
    balance, j = [], B
    for s in range(stages, 0, -1):
        i = cut[s][j]
        balance.append(j - i)
        j = i
    return _plan(balance[::-1], costs, memory)


@dataclass(frozen=True)
class Placement:
    """``ranks[d][s]``: the rank running stage ``s`` of replica ``d``; ``inter_boundaries[d]``: the
    boundaries ``s -> s+1`` of replica ``d`` that cross servers."""

    ranks: tuple[tuple[int, ...], ...]
    inter_boundaries: tuple[tuple[int, ...], ...]

    def stage_of(self, rank: int) -> tuple[int, int]:
        """``(replica, stage)`` of a rank."""
        for d, chain in enumerate(self.ranks):
            if rank in chain:
                return d, chain.index(rank)
        raise ValueError(f"rank {rank} runs no stage.")

    def describe(self) -> str:
        crossing = sorted({b for bs in self.inter_boundaries for b in bs})
        text = ", ".join(f"stage {b}->{b + 1}" for b in crossing) or "none"
        return f"{len(self.ranks)} replica(s) x {len(self.ranks[0])} stage(s); inter-server boundaries: {text}"


def place_stages(topology: ServerTopology, stages: int) -> Placement:
    """Replica ``d`` runs on ranks ``d*PP .. d*PP + PP - 1`` (consecutive, so inside a server as far
    as possible). ``world_size`` must be a multiple of ``stages``."""
    P = topology.world_size
    if stages < 1 or P % stages:
        raise ValueError(
            f"world size {P} is not a multiple of stages={stages}: use devices x num_nodes = data-parallel "
            f"replicas x stages (e.g. stages in {[s for s in range(1, P + 1) if P % s == 0]})."
        )
    ranks, crossings = [], []
    for d in range(P // stages):
        chain = tuple(range(d * stages, (d + 1) * stages))
        ranks.append(chain)
        crossings.append(tuple(s for s in range(stages - 1) if topology.link(chain[s], chain[s + 1]) == "inter"))
    return Placement(tuple(ranks), tuple(crossings))
