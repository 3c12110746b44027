"""Stage planner: the DP equals brute force, respects memory caps; placement reports crossings."""

import itertools
import random

import pytest

from lightning_granndis.pipeline.planner import check_balance, place_stages, plan_stages
from lightning_granndis.topology import ServerTopology


def brute_force(costs, stages, memory, cap):
    best = None
    B = len(costs)
    for cuts in itertools.combinations(range(1, B), stages - 1):
        bounds = (0, *cuts, B)
        parts = [(sum(costs[a:b]), sum(memory[a:b])) for a, b in zip(bounds[:-1], bounds[1:])]
        if any(m > cap for _, m in parts):
            continue
        value = max(c for c, _ in parts)
        best = value if best is None else min(best, value)
    return best


@pytest.mark.parametrize("seed", range(8))
def test_dp_matches_brute_force(seed):
    rng = random.Random(seed)
    B, S = rng.randint(3, 9), rng.randint(1, 3)
    S = min(S, B)
    costs = [rng.uniform(0.1, 5) for _ in range(B)]
    memory = [rng.uniform(0.1, 3) for _ in range(B)]
    cap = rng.uniform(3, 10)
    expected = brute_force(costs, S, memory, cap)
    if expected is None:
        with pytest.raises(ValueError, match="memory_cap"):
            plan_stages(costs, S, memory, cap)
        return
    plan = plan_stages(costs, S, memory, cap)
    assert plan.bottleneck == pytest.approx(expected)
    assert sum(plan.balance) == B and all(m <= cap + 1e-9 for m in plan.stage_memory)


def test_golden_split_and_manual_balance():
    plan = plan_stages([1, 1, 1, 1, 4, 1, 1, 1], 3)
    assert plan.balance == (4, 1, 3) and plan.bottleneck == 4
    assert list(plan.blocks(2)) == [5, 6, 7]
    assert plan_stages([1, 2, 3], 2, balance=[2, 1]).stage_costs == (3.0, 3.0)
    with pytest.raises(ValueError, match="cover all 3 blocks"):
        check_balance([1, 1], 3, 2)
    with pytest.raises(ValueError, match="need 1 <= stages <= 3"):
        plan_stages([1, 2, 3], 4)


def test_placement_keeps_replicas_inside_servers():
    topo = ServerTopology(world_size=8, servers=2)
    four = place_stages(topo, 4)  # 2 replicas of 4 stages: each replica on one server
    assert four.ranks == ((0, 1, 2, 3), (4, 5, 6, 7)) and four.inter_boundaries == ((), ())
    eight = place_stages(topo, 8)  # one replica across both servers: boundary 3 -> 4 crosses
    assert eight.inter_boundaries == ((3,),) and "stage 3->4" in eight.describe()
    assert eight.stage_of(5) == (0, 5)
    with pytest.raises(ValueError, match="not a multiple of stages=3"):
        place_stages(topo, 3)
