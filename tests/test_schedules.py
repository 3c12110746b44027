"""Pipeline schedules: dependencies hold, 1F1B bounds memory, the epilogue is flagged."""

import pytest

from lightning_granndis.pipeline.schedules import Action, build_schedule, peak_in_flight


def simulate(schedule):
    """Runs the stages' action lists with their cross-stage dependencies; returns the order, or
    fails on a deadlock."""
    S = len(schedule)
    pos = [0] * S
    done = set()
    order = []
    while any(pos[s] < len(schedule[s]) for s in range(S)):
        progressed = False
        for s in range(S):
            if pos[s] == len(schedule[s]):
                continue
            a = schedule[s][pos[s]]
            if a.kind == "F":
                ready = s == 0 or ("F", s - 1, a.micro) in done
            else:
                ready = ("F", s, a.micro) in done and (s == S - 1 or ("B", s + 1, a.micro) in done)
            if ready:
                done.add((a.kind, s, a.micro))
                order.append((a.kind, s, a.micro))
                pos[s] += 1
                progressed = True
        assert progressed, "deadlock"
    return order


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages, micro", [(1, 3), (2, 4), (4, 8), (4, 2)])
def test_schedules_complete_without_deadlock(name, stages, micro):
    schedule = build_schedule(name, stages, micro)
    order = simulate(schedule)
    assert len(order) == 2 * stages * micro
    for s in range(stages):
        assert sorted(a.micro for a in schedule[s] if a.kind == "F") == list(range(micro))
        assert sorted(a.micro for a in schedule[s] if a.kind == "B") == list(range(micro))


def test_1f1b_bounds_activations_and_marks_the_epilogue():
    one, gp = build_schedule("1f1b", 4, 8), build_schedule("gpipe", 4, 8)
    assert [peak_in_flight(a) for a in one] == [4, 3, 2, 1]
    assert [peak_in_flight(a) for a in gp] == [8] * 4
    # stage 0: 3 warm-up forwards, 5 steady pairs, 3 cool-down backwards; the last steady
    # backward and the cool-down are the epilogue
    epilogue = [a.micro for a in one[0] if a.kind == "B" and a.epilogue]
    assert epilogue == [4, 5, 6, 7]
    assert one[0][:4] == [Action("F", 0), Action("F", 1), Action("F", 2), Action("F", 3)]
    with pytest.raises(ValueError, match="unknown schedule 'zb'"):
        build_schedule("zb", 2, 2)
