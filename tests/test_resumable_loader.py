"""Training loaders resume mid-epoch: the batches after a saved position, with no random number
drawn by the resumed iterator; a position saved after an epoch's last batch starts a new epoch."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from lightning_granndis.strategies.graph_batches import GraphBatches
from lightning_granndis.strategies.resumable_loader import ResumableDataLoader, resumable
from lightning_granndis.strategies.stage_loader import RelayPlaceholder, StageLoader

DATA = TensorDataset(torch.arange(40))


def shuffled_loader(epoch: int):
    sampler = DistributedSampler(DATA, num_replicas=2, rank=1, shuffle=True, seed=3)
    sampler.set_epoch(epoch)
    return resumable(DataLoader(DATA, batch_size=4, sampler=sampler))


def rows(batches) -> list[list[int]]:
    return [b[0].tolist() for b in batches]


def test_a_plain_loader_becomes_resumable_and_continues_after_its_saved_position():
    loader = shuffled_loader(epoch=2)
    assert isinstance(loader, ResumableDataLoader) and len(loader) == 5
    whole = rows(loader)
    it = iter(loader)
    first = [next(it)[0].tolist() for _ in range(2)]
    state = loader.state_dict()

    resumed = shuffled_loader(epoch=2)
    resumed.load_state_dict(state)
    torch.manual_seed(7)
    rest = rows(resumed)
    drawn = torch.rand(1)
    torch.manual_seed(7)
    assert first + rest == whole  # the epoch's order (Lightning's shuffling sampler), from batch 3 on
    assert torch.equal(drawn, torch.rand(1))  # the resumed iterator drew nothing


def test_a_position_after_the_last_batch_starts_the_next_epoch_whole():
    loader = shuffled_loader(epoch=0)
    it = iter(loader)
    for _ in range(len(loader)):
        next(it)
    resumed = shuffled_loader(epoch=1)
    resumed.load_state_dict(loader.state_dict())
    assert len(rows(resumed)) == len(loader)


def test_other_loaders_are_left_as_they_are():
    class MyLoader(DataLoader):
        pass

    mine = MyLoader(DATA, batch_size=4)
    assert resumable(mine) is mine


def test_relay_placeholders_and_graph_batches_resume_where_they_stood():
    stage = StageLoader(DataLoader(DATA, batch_size=8), loads=lambda: False)
    it = iter(stage)
    next(it), next(it)
    again = StageLoader(DataLoader(DATA, batch_size=8), loads=lambda: False)
    again.load_state_dict(stage.state_dict())
    assert [p.index for p in again] == [2, 3, 4] and isinstance(next(iter(again)), RelayPlaceholder)

    epoch = {"now": 3}
    batches = GraphBatches(["a", "b", "c"], lambda: epoch["now"])
    it = iter(batches)
    next(it)
    resumed = GraphBatches(["a", "b", "c"], lambda: epoch["now"])
    resumed.load_state_dict(batches.state_dict())
    assert list(resumed) == ["b", "c"]
    assert list(resumed) == ["a", "b", "c"]  # the next epoch is whole
    other = GraphBatches(["a", "b", "c"], lambda: 4)  # a position of another epoch is not applied
    other.load_state_dict(batches.state_dict())
    assert list(other) == ["a", "b", "c"]


def test_a_packed_set_unpacks_into_another_folder_as_a_committed_set(tmp_path):
    from lightning_granndis.checkpoint_sets import commit_set, pack_set, unpack_set, verify_set

    source = tmp_path / "server0" / "step=6.ckpt"
    source.parent.mkdir()
    torch.save({"w": torch.arange(5)}, source)
    commit_set(source, [source], step=6, epoch=1)
    copy = unpack_set(tmp_path / "server1", pack_set(source))
    assert copy == tmp_path / "server1" / "step=6.ckpt"
    assert verify_set(copy).step == 6 and torch.equal(torch.load(copy)["w"], torch.arange(5))


def test_replica_snapshots_refuse_a_pipeline_naming_the_alternative():
    from types import SimpleNamespace

    import pytest

    from lightning_granndis.callbacks import ReplicaSnapshot
    from lightning_granndis.strategies import CompressedPipelineStrategy

    trainer = SimpleNamespace(strategy=CompressedPipelineStrategy(stages=2), global_rank=0)
    with pytest.raises(ValueError, match="ResumableCheckpoint alone"):
        ReplicaSnapshot(dirpath="/dev/shm/x").server_folder(trainer)
