"""The graph layer's planner: mode choice and fit checks, and a rank's memory estimate."""

from __future__ import annotations

import pytest

from lightning_granndis.graph.epoch_sampling import Batching
from lightning_granndis.graph.plan import PlanConfig
from lightning_granndis.graph.store import build_shards
from lightning_granndis.graph.training_plan import (
    MemoryEstimate,
    ModelWidths,
    PlanRequest,
    batch_bytes,
    estimate_rank_memory,
    plan_training,
    refuse_unless_fits,
    trim_needed,
    trimmed_training_bytes,
)

WIDTHS = ModelWidths(features=32, hidden=16, layers=3)


def request(mode, budget=2**40):
    return PlanRequest(mode=mode, servers=2, devices=2, widths=WIDTHS, budget=budget)


def test_flx_that_does_not_fit_is_refused_naming_the_modes_that_do(tiny):
    with pytest.raises(ValueError, match=r"mode='flx' would preload .* budget is 0.00 GiB.*mode='eas'.*mode='cob'"):
        plan_training(tiny.data, request("flx", budget=1000))
    assert plan_training(tiny.data, request("flx")).mode == "flx"
    assert plan_training(tiny.data, request("cob")).mode == "cob"


def test_auto_chooses_from_the_cost_model_and_says_why(tiny):
    plan = plan_training(tiny.data, request("auto"), measure_compute=lambda: 1e6)
    assert plan.mode in ("flx", "eas") and plan.reason.startswith("mode=auto chose") and plan.choice is not None
    assert plan_training(tiny.data, request("auto", budget=1000), measure_compute=lambda: 1e6).mode == "cob"


def _shards(tiny, mode):
    cfg = PlanConfig(mode=mode, servers=2, devices_per_server=2, hops=3)
    return [sh for server in build_shards(tiny.data, cfg) for sh in server]


@pytest.mark.parametrize("mode", ["cob", "minibatch"])
def test_a_sampled_mode_s_estimate_follows_the_batch_not_the_epoch(tiny, mode):
    shard = _shards(tiny, mode)[0]

    def estimate(batch_size, fanouts=(5, 5, 5), depth=2):
        return estimate_rank_memory(shard, mode, WIDTHS, list(fanouts), Batching(batch_size), 2, depth, process=0)

    small, big = estimate(16), estimate(256)
    assert small.shard == big.shard > 0  # the shard is what it is
    assert small.batch_vertices < big.batch_vertices and small.batches < big.batches
    assert estimate(64, depth=4).batches == pytest.approx(5 / 3 * estimate(64, depth=2).batches)
    # fewer batches per epoch (bigger ones) cost more; the epoch's length itself costs nothing
    assert estimate(64, fanouts=(1, 1, 1)).batch_vertices < estimate(64).batch_vertices
    # on a host the heap keeps about one more batch's training unless freed memory is released
    assert small.retained == small.training > 0
    assert small.released().total == small.total - small.retained
    on_gpu = estimate_rank_memory(shard, mode, WIDTHS, [5, 5, 5], Batching(16), 2, 2, process=0, on_host=False)
    assert on_gpu.retained == 0 and on_gpu.shard == 0


def test_batch_bytes_count_features_only_for_the_owned_rows():
    held, training = batch_bytes(1000, 400, 5000, WIDTHS)
    assert held == 1000 * 41 + 5000 * 16
    per_row = 32 + (32 + 2 * 16) + 6 * 16 * 3  # features, each layer's input, six values per output
    assert training == 400 * 4 * per_row + 5000 * 16 * 3
    # rows fetched from other ranks: received and as many served
    assert batch_bytes(1000, 400, 5000, WIDTHS, fetched=100)[1] == training + 2 * 100 * 4 * 32


def test_refusal_names_the_worst_rank_its_estimate_the_budget_and_a_fix():
    estimates = [MemoryEstimate(100 * 2**20, 0, 0, 0), MemoryEstimate(100 * 2**20, 300 * 2**20, 10 * 2**20, 0)]
    refuse_unless_fits(estimates, 500 * 2**20, "eas", "granndis")  # fits: nothing raised
    with pytest.raises(MemoryError, match=r"mode='eas' would need ~410 MB per rank \(process 100 MB \+ shard 300 MB.*"
                                          r"on rank 1, but the budget is 400 MB per rank.*mode='cob'"):
        refuse_unless_fits(estimates, 400 * 2**20, "eas", "granndis")


@pytest.mark.parametrize("mode", ["cob", "minibatch"])
def test_trimmed_layers_estimate_less_and_switch_on_only_where_needed(tiny, mode):
    shard = _shards(tiny, mode)[0]
    estimate = estimate_rank_memory(shard, mode, WIDTHS, [5, 5, 5], Batching(64), 2, 2, process=0)
    trimmed = estimate.trimmed()
    assert 0 < trimmed.training < estimate.training and trimmed.layers_trimmed
    assert trimmed.retained == trimmed.training  # the heap keeps about one (smaller) batch
    assert "layers trimmed" in trimmed.describe() and "layers trimmed" not in estimate.describe()
    assert trim_needed(estimate, estimate.total - 1, None) and not trim_needed(estimate, estimate.total, None)
    assert trim_needed(estimate, 2**40, True) and not trim_needed(estimate, 1, False)
    # a mode with nothing to trim (EAS: one whole server subgraph) never trims
    eas = estimate_rank_memory(_shards(tiny, "eas")[0], "eas", WIDTHS, [5, 5, 5], Batching(64), 2, 2, process=0)
    assert not trim_needed(eas, 1, True) and eas.trimmed() == eas


def test_trimmed_training_bytes_follow_the_rows_each_layer_computes():
    # 1000 rows, layers computing 300, 40 and 5 of them over 900, 120 and 15 edges
    got = trimmed_training_bytes(1000, [300, 40, 5], [900, 120, 15], WIDTHS)
    values = 1000 * 32 + 2 * 1000 * 16 + 300 * (32 + 6 * 16) + (40 + 5) * (16 + 6 * 16)
    assert got == 4 * values + 16 * (900 + 120 + 15)


def test_refusal_suggests_trimming_where_it_is_not_on():
    untrimmed = MemoryEstimate(0, 0, 0, 900 * 2**20, training_trimmed=100 * 2**20)
    with pytest.raises(MemoryError, match="trim_layers=True"):
        refuse_unless_fits([untrimmed], 50 * 2**20, "cob", "granndis")
    with pytest.raises(MemoryError) as error:
        refuse_unless_fits([untrimmed.trimmed()], 50 * 2**20, "cob", "granndis")
    assert "trim_layers" not in str(error.value) and "layers trimmed" in str(error.value)


def test_a_cob_eas_estimate_counts_the_inner_edges_it_keeps(tiny):
    shard = _shards(tiny, "cob")[0]

    def estimate(keep_inner):
        return estimate_rank_memory(shard, "cob", WIDTHS, [2, 2, 2], Batching(32), 2, 2, process=0,
                                    keep_inner=keep_inner)

    assert estimate(True).batch_edges > estimate(False).batch_edges
