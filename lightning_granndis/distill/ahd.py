r"""Automatic Hybrid Distribution: the stage split x data-parallel widths that minimise the
bottleneck stage (Pipe-BD, Jang et al., DATE'23, §III-C).

With Decoupled Parameter Updates the stages run as a pipeline, so a step takes as long as its
slowest stage. Stage ``k`` holding blocks ``a..b`` on ``g`` ranks (starting at rank ``r``) costs

.. math::
    c_k = \sum_{i=a}^{b} \big(t_i(\lceil B/g \rceil) + s_i(\lceil B/g \rceil)\big)
          + T_{\text{all-reduce}}\Big(\sum_{i=a}^{b} |\theta_i|, g\Big)
          + T_{\text{relay}}\big(f_{a-1} \lceil B/g \rceil\big)

with ``t_i``/``s_i`` the profiled teacher-forward and student forward+backward seconds of block
``i`` at that per-rank batch, ``θ_i`` its student parameters (ring all-reduce over the stage's
ranks) and ``f_{a-1}`` the bytes per row the stage receives.

When the ranks share ``D < P`` compute devices (processes on CPU cores), a step also takes at
least the busy rank-seconds over ``D``: the predicted step time is

.. math::
    T = \max\Big(\max_k c_k,\; \frac{1}{D}\sum_k g_k\, \mathrm{compute}_k\Big)

(on GPUs, one per rank, only the first term counts). :func:`search_schedule` minimises ``T``,
then the rank-seconds, over every split and every width assignment using exactly ``world_size``
ranks — the same optimum as enumerating all ``sum_K C(N-1, K-1) C(P-1, K-1)`` schedules, by
dynamic programmes over (blocks placed, ranks used), ``O(N^2 P^2)`` each. Unlike the artifact's
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
        shared_devices: compute devices the ranks share (CPU cores of processes with one thread);
            ``None`` (default): one device per rank, as with GPUs.
    """

    costs: BlockCosts
    link_model: LinkModel = field(default_factory=lambda: LinkModel.preset("granndis_paper"))
    server_of: Callable[[int], int] = lambda rank: 0
    shared_devices: float | None = None

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

    def rank_seconds(self, schedule: DistillSchedule) -> float:
        """Busy compute seconds per step, summed over ranks."""
        return sum(w * self.compute(s[0], s[-1], w) for s, w in zip(schedule.stages, schedule.widths))

    def step_time(self, bottleneck: float, rank_seconds: float) -> float:
        return max(bottleneck, rank_seconds / self.shared_devices) if self.shared_devices else bottleneck


@dataclass(frozen=True)
class SearchResult:
    schedule: DistillSchedule
    #: the predicted step time: the bottleneck stage, or the shared devices' load if larger
    predicted_s: float
    bottleneck_s: float
    stage_s: tuple[float, ...]
    rank_seconds: float

    def describe(self) -> str:
        stages = ", ".join(f"{list(s)} on {w} rank{'s' if w > 1 else ''}: {c * 1e3:.1f} ms"
                           for s, w, c in zip(self.schedule.stages, self.schedule.widths, self.stage_s))
        shared = "" if self.predicted_s == self.bottleneck_s else \
            f"; bound by the shared devices: {self.rank_seconds * 1e3:.0f} busy rank-ms per step"
        return (f"AHD schedule {self.schedule.describe()} — predicted {self.predicted_s * 1e3:.1f} ms/step "
                f"({stages}{shared})")


def search_schedule(model: StageCostModel, world_size: int) -> SearchResult:
    """The schedule over exactly ``world_size`` ranks with the smallest predicted step time
    (:meth:`StageCostModel.step_time`); among those, the fewest busy rank-seconds.

    ``W(T)``, the fewest rank-seconds of any schedule whose stages all cost at most ``T``, is one
    exact dynamic programme; it never grows with ``T``. The optimum is ``min_T max(T, W(T)/D)``
    over the stage costs ``T`` at or above the smallest possible bottleneck (another programme),
    found by bisection where ``T`` crosses ``W(T)/D``.
    """
    n = model.costs.num_blocks
    if world_size < 1 or n < 1:
        raise ValueError(f"need at least one block and one rank, got {n} blocks and world size {world_size}.")
    widths = [g for g in range(1, min(world_size, model.costs.batch) + 1)
              if g in model.costs.teacher and g in model.costs.student]
    # stage j..i-1 on g ranks from rank r; the first stage starts at rank 0, later ones after it
    keys = [(j, i, g, r) for i in range(1, n + 1) for j in range(i) for g in widths
            for r in ([0] if j == 0 else range(1, world_size - g + 1))]
    cost = {k: model.stage_cost(k[0], k[1] - 1, k[2], k[3]) for k in keys}
    work = {k: k[2] * model.compute(k[0], k[1] - 1, k[2]) for k in keys}
    inf = float("inf")

    def solve(value, combine, limit):
        # best[i][r]: (value, previous (j, r0)) for blocks 0..i-1 on ranks 0..r-1, stages costing <= limit
        best = [[(inf, None)] * (world_size + 1) for _ in range(n + 1)]
        best[0][0] = (0.0, None)
        for i in range(1, n + 1):
            for r in range(1, world_size + 1):
                for j in range(i):
                    for g in widths:
                        key = (j, i, g, r - g)
                        if g > r or best[j][r - g][0] == inf or key not in cost or cost[key] > limit:
                            continue
                        v = combine(best[j][r - g][0], value[key])
                        if v < best[i][r][0]:
                            best[i][r] = (v, (j, r - g))
        return best

    bottleneck = solve(cost, max, inf)[n][world_size][0]
    if bottleneck == inf:
        raise ValueError(
            f"no schedule places {n} blocks on {world_size} ranks with a batch of {model.costs.batch} rows "
            "(every rank needs at least one row): use fewer processes or a larger batch."
        )
    eps = 1 + 1e-12
    limits = sorted({c for c in cost.values() if c <= bottleneck * eps and c >= bottleneck / eps} |
                    ({c for c in cost.values() if c > bottleneck} if model.shared_devices else set()))
    least = lambda limit: solve(work, lambda a, b: a + b, limit * eps)  # noqa: E731
    # the first limit whose own value is at least the shared devices' load W(T)/D (a bisection)
    lo, hi = 0, len(limits) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if model.step_time(limits[mid], least(limits[mid])[n][world_size][0]) <= limits[mid] * eps:
            hi = mid
        else:
            lo = mid + 1
    options = []
    for k in {lo, max(0, lo - 1)}:
        best = least(limits[k])
        options.append((model.step_time(limits[k], best[n][world_size][0]), best[n][world_size][0], k, best))
    _, _, _, best = min(options, key=lambda o: o[:3])
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
    rank_s = model.rank_seconds(schedule)
    return SearchResult(schedule, model.step_time(max(stage_s), rank_s), max(stage_s), stage_s, rank_s)
