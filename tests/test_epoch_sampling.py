"""Per-epoch sampling: the bounded producer (units) and CoB / MB_base / EAS(resample='epoch') in
real 4-process runs (2 servers x 2 devices) on the tiny synthetic graph: fresh batches every
epoch, the same ones for the same seed, and a run resumed from an epoch's checkpoint that draws
and trains exactly as the uninterrupted run."""

from __future__ import annotations

import json
import threading
import time

import pytest
import torch

from helpers import torchrun
from lightning_granndis.datamodules.ogb import OGBNodeDataModule
from lightning_granndis.graph.epoch_sampling import BoundedProducer, epoch_generator

NAMES = ["cob", "mb", "eas_epoch", "cob_unshared", "cob_trim", "mb_trim"]


def test_generator_streams_differ_by_epoch_and_stream_and_repeat_for_the_same_triple():
    draw = lambda *key: torch.rand(4, generator=epoch_generator(*key))  # noqa: E731
    assert torch.equal(draw(0, 1, 2), draw(0, 1, 2))
    assert not torch.equal(draw(0, 1, 2), draw(0, 2, 2))
    assert not torch.equal(draw(0, 1, 2), draw(0, 1, 3))
    assert not torch.equal(draw(0, 1, 2), draw(1, 1, 2))


def test_producer_keeps_at_most_depth_items_waiting():
    made = []

    def make():
        for i in range(20):
            made.append(i)
            yield i

    producer = BoundedProducer(make, depth=3)
    time.sleep(0.3)  # a slow consumer: the producer runs ahead as far as it may
    assert len(made) <= 3 + 1  # `depth` queued plus the one it is trying to put
    assert list(producer) == list(range(20))
    assert 1 <= producer.high_water <= 3


def test_producer_error_reaches_the_consumer():
    def make():
        yield 1
        raise RuntimeError("sampler broke")

    producer = BoundedProducer(make, depth=2)
    with pytest.raises(RuntimeError, match="sampler broke"):
        list(producer)


def test_producer_stops_when_the_consumer_leaves_early():
    def make():
        i = 0
        while True:
            yield i
            i += 1

    producer = BoundedProducer(make, depth=2)
    for item in producer:
        if item == 3:
            break
    producer.close()
    assert not producer._thread.is_alive()
    with pytest.raises(ValueError, match="depth"):
        BoundedProducer(make, depth=0)
    assert threading.active_count() < 50


@pytest.fixture(scope="module")
def sampling_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    OGBNodeDataModule("synthetic-tiny", root=str(root)).prepare_data()
    return root


@pytest.fixture(scope="module")
def runs(tmp_path_factory, sampling_root):
    out, root = tmp_path_factory.mktemp("sampling"), sampling_root
    torchrun("gnn_sampling.py", 4, str(out), str(root), ",".join(NAMES), timeout=600)
    return {name: [json.loads((out / name / f"rank{r}.json").read_text()) for r in range(4)] for name in NAMES}


@pytest.mark.parametrize("name", NAMES)
def test_every_epoch_draws_new_batches(runs, name):
    for rank in runs[name]:
        epochs = rank["first"]["batches"]
        assert len(epochs) == 3 and all(len(b) == rank["first"]["iterations"] for b in epochs.values())
        digests = [d for batches in epochs.values() for d in batches]
        assert len(set(digests)) == len(digests)  # no batch repeats, within or across epochs


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_draws_the_same_batches_and_trains_the_same(runs, name):
    for rank in runs[name]:
        assert rank["again"]["batches"] == rank["first"]["batches"]
        for key, value in rank["first"]["params"].items():
            assert torch.equal(torch.tensor(rank["again"]["params"][key]), torch.tensor(value)), key


@pytest.mark.parametrize("name", NAMES)
def test_resumed_from_epoch_checkpoint_equals_uninterrupted(runs, name):
    for rank in runs[name]:
        first, resumed = rank["first"], rank["resumed"]
        assert "0" not in resumed["batches"]  # it did start from the checkpoint
        assert resumed["batches"] == {k: v for k, v in first["batches"].items() if k != "0"}
        for key, value in first["params"].items():
            assert torch.allclose(torch.tensor(resumed["params"][key]), torch.tensor(value), atol=1e-6, rtol=0), key


@pytest.mark.parametrize("name", NAMES)
def test_producer_never_holds_more_than_its_depth(runs, name):
    for rank in runs[name]:
        assert 1 <= rank["first"]["high_water"] <= rank["first"]["depth"]
        assert rank["first"]["producer_stopped"]  # no sampling thread outlives the fit


@pytest.mark.parametrize("name", ["cob", "mb"])
def test_at_most_depth_plus_one_batches_alive_per_rank(runs, name):
    for rank in runs[name]:
        assert 2 <= rank["first"]["most_held"] <= rank["first"]["depth"] + 1


def _train_seeds(root) -> int:
    dm = OGBNodeDataModule("synthetic-tiny", root=str(root))
    dm.setup()
    return int(dm.data.train_mask.sum())


def test_minibatch_batches_are_batch_size_seeds_per_rank_as_pyg_ddp(runs, sampling_root):
    n = _train_seeds(sampling_root)
    ranks = runs["mb"]
    batch = ranks[0]["first"]["batch_size"]
    steps = -(-n // (4 * batch))
    for epoch, sizes in ranks[0]["first"]["seeds"].items():
        per_step = [sum(r["first"]["seeds"][epoch][k] for r in ranks) for k in range(len(sizes))]
        assert len(sizes) == steps == ranks[0]["first"]["iterations"]
        assert per_step == [min(4 * batch, n - 4 * batch * k) for k in range(steps)]
        for r in ranks:  # every rank its batch_size, the last step dealt as DistributedSampler deals it
            assert r["first"]["seeds"][epoch][:-1] == [batch] * (steps - 1)


def test_co_batches_are_devices_times_batch_size_seeds_per_server(runs):
    ranks = runs["cob"]
    batch = ranks[0]["first"]["batch_size"]
    for epoch in ranks[0]["first"]["seeds"]:
        for server in (0, 1):
            sizes = [a + b for a, b in zip(ranks[2 * server]["first"]["seeds"][epoch],
                                           ranks[2 * server + 1]["first"]["seeds"][epoch])]
            full = [s for s in sizes if s == 2 * batch]
            assert sizes[: len(full)] == full and len(full) >= len(sizes) - 1  # only the last one is partial
            assert 0 < sizes[-1] <= 2 * batch or server_ran_out(sizes)


def server_ran_out(sizes) -> bool:
    return sizes[-1] == 0


def test_a_server_samples_each_co_batch_once_and_trains_as_if_every_device_had(runs):
    """Shared: step k's co-batch sampled on device k mod 2 and handed out (booked intra-server);
    the same co-batches and the same training as every device sampling it whole."""
    for shared, alone in zip(runs["cob"], runs["cob_unshared"]):
        assert shared["first"]["batches"] == alone["first"]["batches"]
        assert shared["first"]["seeds"] == alone["first"]["seeds"]
        for key, value in alone["first"]["params"].items():
            assert torch.allclose(torch.tensor(shared["first"]["params"][key]), torch.tensor(value), atol=1e-6), key
        assert shared["first"]["sampling_bytes"] > 0 and alone["first"]["sampling_bytes"] == 0


@pytest.mark.parametrize("name", ["cob", "mb"])
def test_trimmed_layers_train_as_untrimmed(runs, name):
    """trim_layers: layer k computes only the rows within L - 1 - k hops; the seeds' outputs, so
    the losses and the training, are those of the masked untrimmed layers (dropout 0, no norm)."""
    for trimmed, whole in zip(runs[f"{name}_trim"], runs[name]):
        assert trimmed["first"]["layers_trimmed"] and not whole["first"]["layers_trimmed"]  # auto: fits untrimmed
        assert trimmed["first"]["trimmed_steps"] == 3 * trimmed["first"]["iterations"] and not whole["first"]["trimmed_steps"]
        assert trimmed["first"]["batches"] == whole["first"]["batches"]
        for key, value in whole["first"]["params"].items():
            assert torch.allclose(torch.tensor(trimmed["first"]["params"][key]), torch.tensor(value),
                                  atol=1e-5), key
