"""Automatic Hybrid Distribution: the stage split x data-parallel widths that minimise the
bottleneck stage (Pipe-BD, Jang et al., DATE'23, §III-C).

With Decoupled Parameter Updates the stages run as a pipeline, so a step takes as long as its
slowest stage. Stage ``k`` holding blocks ``a..b`` on ``g`` ranks (starting at rank ``r``) costs

.. math::
    c_k = \\sum_{i=a}^{b} \\big(t_i(\\lceil B/g \\rceil) + s_i(\\lceil B/g \\rceil)\\big)
          + T_{\\text{all-reduce}}\\Big(\\sum_{i=a}^{b} |\\theta_i|, g\\Big)
          + T_{\\text{relay}}\\big(f_{a-1} \\lceil B/g \\rceil\\big)

with ``t_i``/``s_i`` the profiled teacher-forward and student forward+backward seconds of block
``i`` at that per-rank batch, ``θ_i`` its student parameters (ring all-reduce over the stage's
ranks) and ``f_{a-1}`` the bytes per row the stage receives. :func:`search_schedule` minimises
``max_k c_k`` (then the total ``sum_k c_k``) over every split and every width assignment using
exactly ``world_size`` ranks, by dynamic programming over (blocks placed, ranks used) — the same
optimum as enumerating all ``sum_K C(N-1, K-1) C(P-1, K-1)`` schedules, in ``O(N^2 P^2)``. Unlike the artifact's
enumeration (hard-coded for 4 ranks), it takes any block count and world size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from lightning_granndis.distill.schedule import DistillSchedule
from lightning_granndis.link_model import LinkModel


@dataclass
class BlockCosts:
    """What the search needs to know about the blocks, for a step of ``batch`` rows.

    Args:
        batch: rows per step (the whole pipeline's batch).
        teacher: ``{width: [seconds of teacher block i's forward at ceil(batch / width) rows]}``.
        student: ``{width: [seconds of student block i's forward + backward at that batch]}``.
        param_bytes: bytes of student block ``i``'s parameters (all-reduced in a data-parallel stage).
        feature_bytes: bytes per row of teacher block ``i``'s output (relayed to the next stage),
            labels included.
    """

    batch: int
    teacher: dict[int, list[float]]
    student: dict[int, list[float]]
    param_bytes: list[int]
    feature_bytes: list[int]

    @property
    def num_blocks(self) -> int:
        return len(self.param_bytes)

    def rows(self, width: int) -> int:
        return math.ceil(self.batch / width)


@dataclass
class StageCostModel:
    """Seconds one stage takes per step: profiled compute plus modelled all-reduce and relay.

    Args:
        costs: the profiled :class:`BlockCosts`.
        link_model: prices the all-reduce and the relay (default: one server, ``granndis_paper``).
        server_of: maps a rank to its server (default: all ranks on one server).
    """

    costs: BlockCosts
    link_model: LinkModel = field(default_factory=lambda: LinkModel.preset("granndis_paper"))
    server_of: Callable[[int], int] = lambda rank: 0

    def link(self, ranks: list[int]) -> str:
        return "inter" if len({self.server_of(r) for r in ranks}) > 1 else "intra"

    def compute(self, first: int, last: int, width: int) -> float:
        c = self.costs
        return sum(c.teacher[width][i] + c.student[width][i] for i in range(first, last + 1))

    def all_reduce(self, first: int, last: int, width: int, first_rank: int) -> float:
        if width == 1:
            return 0.0
        nbytes = sum(self.costs.param_bytes[first:last + 1])
        ranks = list(range(first_rank, first_rank + width))
        return self.link_model.time(self.link(ranks), int(2 * (width - 1) / width * nbytes), messages=2 * (width - 1))

    def relay(self, first: int, width: int, first_rank: int) -> float:
        if first == 0:
            return 0.0
        nbytes = self.costs.feature_bytes[first - 1] * self.costs.rows(width)
        return self.link_model.time(self.link([first_rank - 1, first_rank]), nbytes)

    def stage_cost(self, first: int, last: int, width: int, first_rank: int) -> float:
        """Seconds per step of a stage of blocks ``first..last`` on ranks ``first_rank ..
        first_rank + width - 1``."""
        return (self.compute(first, last, width) + self.all_reduce(first, last, width, first_rank)
                + self.relay(first, width, first_rank))

    def schedule_costs(self, schedule: DistillSchedule) -> list[float]:
        return [self.stage_cost(s[0], s[-1], w, schedule.first_rank(k))
                for k, (s, w) in enumerate(zip(schedule.stages, schedule.widths))]


@dataclass(frozen=True)
class SearchResult:
    schedule: DistillSchedule
    bottleneck_s: float
    stage_s: tuple[float, ...]

    def describe(self) -> str:
        stages = ", ".join(f"{list(s)} on {w} rank{'s' if w > 1 else ''}: {c * 1e3:.1f} ms"
                           for s, w, c in zip(self.schedule.stages, self.schedule.widths, self.stage_s))
        return f"AHD schedule {self.schedule.describe()} — predicted {self.bottleneck_s * 1e3:.1f} ms/step ({stages})"


def search_schedule(model: StageCostModel, world_size: int) -> SearchResult:
    """The schedule over exactly ``world_size`` ranks with the smallest bottleneck stage cost;
    among those, the smallest total of stage costs (the fewest busy rank-seconds).

    Two exact dynamic programmes over (blocks placed, ranks used): the first finds the smallest
    bottleneck ``b*``, the second the smallest total among schedules whose every stage costs at
    most ``b*``.
    """
    n = model.costs.num_blocks
    if world_size < 1 or n < 1:
        raise ValueError(f"need at least one block and one rank, got {n} blocks and world size {world_size}.")
    widths = [g for g in range(1, min(world_size, model.costs.batch) + 1)
              if g in model.costs.teacher and g in model.costs.student]
    # stage j..i-1 on g ranks from rank r; the first stage starts at rank 0, later ones after it
    cost = {(j, i, g, r): model.stage_cost(j, i - 1, g, r)
            for i in range(1, n + 1) for j in range(i) for g in widths
            for r in ([0] if j == 0 else range(1, world_size - g + 1))}

    def solve(combine, allowed):
        # best[i][r]: (value, previous (j, r0)) for blocks 0..i-1 on ranks 0..r-1
        inf = float("inf")
        best = [[(inf, None)] * (world_size + 1) for _ in range(n + 1)]
        best[0][0] = (0.0, None)
        for i in range(1, n + 1):
            for r in range(1, world_size + 1):
                for j in range(i):
                    for g in widths:
                        if g > r or best[j][r - g][0] == inf or (j, i, g, r - g) not in cost \
                                or not allowed(cost[j, i, g, r - g]):
                            continue
                        v = combine(best[j][r - g][0], cost[j, i, g, r - g])
                        if v < best[i][r][0]:
                            best[i][r] = (v, (j, r - g))
        return best

    first = solve(max, lambda c: True)
    bottleneck = first[n][world_size][0]
    if bottleneck == float("inf"):
        raise ValueError(
            f"no schedule places {n} blocks on {world_size} ranks with a batch of {model.costs.batch} rows "
            "(every rank needs at least one row): use fewer processes or a larger batch."
        )
    best = solve(lambda a, b: a + b, lambda c: c <= bottleneck * (1 + 1e-12))
    stages, widths_out, i, r = [], [], n, world_size
    while i > 0:
        _, prev = best[i][r]
        assert prev is not None
        j, r0 = prev
        stages.append(list(range(j, i)))
        widths_out.append(r - r0)
        i, r = j, r0
    schedule = DistillSchedule.build(stages[::-1], widths_out[::-1])
    stage_s = tuple(model.schedule_costs(schedule))
    return SearchResult(schedule, max(stage_s), stage_s)
