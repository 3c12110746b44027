"""The paper's cost model (Eqs. 1-5) and the auto mode choice."""

import pytest

from lightning_granndis.graph.cost_model import SubgraphSize, choose_mode, epoch_times, memory_bytes


def test_epoch_times_golden():
    t = epoch_times(V=1000, E=8000, servers=2, devices=2, C=100.0, B_intra=1000.0, B_inter=10.0, R_flx=2.0, R_eas=1.5)
    # Eq. 1: 1000/400 + 2000 * (0.25/1000 + 0.5/10) = 2.5 + 100.5
    assert t["fb"] == pytest.approx(103.0)
    # Eqs. 2-3: 1000*2/400 + 8000*2/4 * 0.5/1000 = 5 + 2
    assert t["flx"] == pytest.approx(7.0)
    assert t["eas"] == pytest.approx(1000 * 1.5 / 400 + 8000 * 1.5 / 4 * 0.5 / 1000)


def test_memory_estimate_grows_with_the_subgraph():
    small, big = SubgraphSize(100, 1000), SubgraphSize(200, 2000)
    assert memory_bytes(big, 32, 64, 3) == 2 * memory_bytes(small, 32, 64, 3)


def choose(**kw):
    base = dict(V=1000, E=8000, servers=2, devices=2, C=100.0, B_intra=1000.0, B_inter=10.0, R_flx=2.0, R_eas=1.5,
                flx_bytes=10, eas_bytes=5, budget=100)
    return choose_mode(**{**base, **kw})


def test_choice_follows_memory_and_cost():
    assert choose().mode == "flx"
    assert "fits and pays off" in choose().reason
    assert choose(flx_bytes=1000).mode == "eas" and "FLX does not fit" in choose(flx_bytes=1000).reason
    # a fast inter-server link makes full-graph exchange cheaper than the preloading expansion
    fast = choose(B_inter=1e9, R_flx=3.9)
    assert fast.mode == "eas" and "expansion costs more" in fast.reason
    assert choose(flx_bytes=1000, eas_bytes=1000).mode == "cob"
