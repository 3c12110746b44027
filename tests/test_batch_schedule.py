"""Steps and batches of a sampled epoch against PyG + DDP's (Lightning's DistributedSampler over
the training seeds, NeighborLoader's batch_size), and the per-hop fan-out checks."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from lightning_granndis.graph.batch_schedule import (
    batch_bounds,
    check_batch_size,
    dealt_to_rank,
    describe,
    step_totals,
    steps_per_epoch,
)
from lightning_granndis.graph.fanouts import check_fanout_type, resolve_fanouts


@pytest.mark.parametrize("n, world, batch", [(1000, 4, 64), (1001, 4, 64), (90941, 4, 1024), (7, 4, 2), (10, 3, 4)])
def test_minibatch_steps_and_batches_are_distributed_sampler_and_dataloader_s(n, world, batch):
    steps = steps_per_epoch([n], world * batch)
    order = torch.arange(n)  # an unshuffled permutation: the sampler's order is then readable
    for rank in range(world):
        sampler = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=False)
        theirs = list(DataLoader(list(range(n)), batch_size=batch, sampler=sampler))
        assert len(theirs) == steps == math.ceil(n / (world * batch))
        bounds = batch_bounds(n, world * batch, steps)
        for k, (lo, hi) in enumerate(bounds):
            ours = dealt_to_rank(order[lo:hi], rank, world).tolist()
            # the sampler pads the last step with repeats of the first seeds; we deal no repeats
            assert ours == theirs[k].tolist()[: len(ours)]
            assert all(v < 2 * world * batch for v in theirs[k].tolist()[len(ours):])
    assert step_totals([n], world * batch, steps) == [hi - lo for lo, hi in batch_bounds(n, world * batch, steps)]
    assert sum(step_totals([n], world * batch, steps)) == n


def test_drop_last_keeps_full_batches_only():
    assert steps_per_epoch([1001], 400, drop_last=True) == 2
    assert steps_per_epoch([399], 400, drop_last=True) == 0
    assert step_totals([1001], 400, 2) == [400, 400]


def test_co_batches_run_the_longest_server_s_count_and_weigh_an_empty_one_zero():
    # two servers, co-batches of 2 devices x 50 seeds: 230 seeds take 3 steps, 180 two and an empty one
    steps = steps_per_epoch([230, 180], 100)
    assert steps == 3
    assert batch_bounds(180, 100, steps) == [(0, 100), (100, 180), (180, 180)]
    assert step_totals([230, 180], 100, steps) == [200, 180, 30]
    assert "PyG + DDP" not in describe(steps, 410, 4, 50, False, co_batch=100)  # ceil(410 / 200) = 3
    assert "PyG + DDP would take 3" in describe(4, 410, 4, 50, False, co_batch=100)


def test_iterations_cut_near_equal_batches_as_tensor_split():
    bounds = batch_bounds(10, 0, 0, iterations=3)
    assert [hi - lo for lo, hi in bounds] == [t.numel() for t in torch.tensor_split(torch.arange(10), 3)]
    assert steps_per_epoch([10, 4], 100, iterations=3) == 3


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "8"])
def test_bad_batch_size_is_refused_naming_it(bad):
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        check_batch_size(bad)


def test_fanouts_in_pyg_num_neighbors_form():
    assert resolve_fanouts([15, 10, 5], 3, 25) == [15, 10, 5]
    assert resolve_fanouts(10, 3, 25) == [10, 10, 10]
    assert resolve_fanouts(None, 2, 25) == [25, 25]
    assert resolve_fanouts([-1, 4], 2, 25) == [-1, 4]
    with pytest.raises(ValueError, match=r"fanout=\[15, 10\] has 2 entries but the model's message-passing layers "
                                         r"number 3"):
        resolve_fanouts([15, 10], 3, 25)
    for bad in (0, [15, 0, 5], [15, -3], [1.5], "15", [], [True]):
        with pytest.raises(ValueError, match="fanout"):
            check_fanout_type(bad)
