"""Training loaders that resume mid-epoch exactly: Lightning saves a loader's ``state_dict()`` in
every checkpoint and hands it back on resume (its ``_Stateful`` protocol); a plain ``DataLoader``
has none, so Lightning replays the interrupted epoch from its start.

:func:`resumable` turns a user's plain ``DataLoader`` into a :class:`ResumableDataLoader`, torchdata's
``StatefulDataLoader`` (it records how far the sampler got, worker and dataset state, and fast-forwards
on resume) with these additions, which make the continuation equal the uninterrupted run:

* a resumed iterator draws no random number. Making an iterator draws its base seed from torch's
  generator; the uninterrupted run drew it at the epoch's start, before the checkpoint captured the
  generators, so a second draw would shift every dropout mask after the resume.
* a state saved once the epoch's last batch was out resumes at the next epoch's start, which
  draws the seed the uninterrupted run's next iterator drew (with ``persistent_workers``, none:
  the workers go on with the generators they ended the epoch with).
* with worker processes, each worker's generators (torch, NumPy, Python: what augmentation draws
  from, after the user's ``worker_init_fn``) are part of the saved state and restored with it.
* torch's ``RandomSampler`` runs as torchdata's, whose permutation resumes.
* the sampler's epoch is set before the resumed iterator reads it: a multi-worker iterator reads
  its first indices as it is made, before Lightning would set the epoch.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, IterableDataset, RandomSampler
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import RandomSampler as StatefulRandomSampler

from lightning_granndis import random_state

# torchdata 0.11 calls torch.set_vital in every loader's __init__, which torch 2.14 deprecates:
# noise about the library's internals, once per loader and rank
warnings.filterwarnings("ignore", message="'set_vital' is deprecated", category=UserWarning)


def _finished(state: dict[str, Any], length: int | None) -> bool:
    """Whether the saved iterator had yielded its epoch's last batch (single- or multi-process layout)."""
    if state.get("_iterator_finished"):
        return True
    yielded = state.get("_num_yielded", state.get("_snapshot", {}).get("_snapshot_step"))
    return yielded is not None and length is not None and yielded >= length


class WorkerGenerators(Dataset):
    """A map-style dataset read in worker processes, whose state (kept by ``StatefulDataLoader``
    with each batch a worker fetches) is that worker's generators, plus the dataset's own state if
    it has one. Everything else is the dataset's."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index):
        return self.dataset[index]

    def __getattr__(self, name: str):
        if name == "dataset":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"generators": random_state.capture()}
        if callable(getattr(self.dataset, "state_dict", None)):
            state["dataset"] = self.dataset.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        random_state.restore(state["generators"])
        if "dataset" in state:
            self.dataset.load_state_dict(state["dataset"])


class ResumableDataLoader(StatefulDataLoader):
    """A ``StatefulDataLoader`` whose resumed iterator draws no random number, whose workers'
    generators resume, and whose state, once the epoch's last batch is out, resumes at the next
    epoch's start."""

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict.get("_iterator_finished") and _finished(state_dict, _length(self)):
            # saved once the last batch was out but before the iterator said so: the next iteration
            # is a new epoch, as torchdata makes it for a finished state (its sampler state kept)
            state_dict = {**state_dict, "_iterator_finished": True}
        super().load_state_dict(state_dict)

    def started_state(self) -> dict[str, Any] | None:
        """``state_dict()`` once iterated, else ``None``: asking a loader that never ran would
        start its workers, drawing a seed the run would not have drawn."""
        return self.state_dict() if self._iterator is not None else None

    def load_state_between_epochs(self, state: dict[str, Any]) -> None:
        """Loads ``state`` as of its epoch's end, wherever the iterator stood (an evaluation loader
        begins every pass anew; the sanity check stops one short): the seed, sampler and workers'
        generators carry over, the position does not."""
        super().load_state_dict({**state, "_iterator_finished": True})

    def _get_iterator(self):
        if self.next_iter_state is None:
            return super()._get_iterator()
        # The iterator that restores draws no seed: a resumed epoch drew its own before the
        # checkpoint; after a finished epoch torchdata makes the next epoch's iterator at once (which
        # draws, as the uninterrupted run's did), or, with persistent workers, resets it (no draw).
        with torch.random.fork_rng(devices=[]):
            return super()._get_iterator()


def _length(loader: DataLoader) -> int | None:
    try:
        return len(loader)
    except TypeError:  # an iterable dataset without a length
        return None


def _stateful(sampler: Any) -> Any:
    """torch's ``RandomSampler`` as torchdata's, which keeps its permutation's generator in the
    state (torch's draws a new permutation when fast-forwarded after a restart)."""
    if type(sampler) is RandomSampler:
        return StatefulRandomSampler(sampler.data_source, replacement=sampler.replacement,
                                     num_samples=sampler._num_samples, generator=sampler.generator)
    return sampler


def resumable(loader: Any, epoch: int | None = None) -> Any:
    """``loader`` as a :class:`ResumableDataLoader` with the same dataset, sampler (Lightning's
    distributed one included), batching, collation and workers; any other object (a stateful
    loader already, a user's own loader class, an iterable) is returned as it is. ``epoch``: the
    epoch its sampler is set to before any iterator is made (the resumed epoch)."""
    if epoch is not None:
        from lightning.fabric.utilities.data import _set_sampler_epoch

        _set_sampler_epoch(loader, epoch)
    if type(loader) is not DataLoader:
        return loader
    kwargs: dict[str, Any] = dict(
        num_workers=loader.num_workers, collate_fn=loader.collate_fn, pin_memory=loader.pin_memory,
        timeout=loader.timeout, worker_init_fn=loader.worker_init_fn, generator=loader.generator,
        multiprocessing_context=loader.multiprocessing_context, persistent_workers=loader.persistent_workers,
        pin_memory_device=loader.pin_memory_device,
    )
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    if isinstance(loader.dataset, torch.utils.data.IterableDataset):
        kwargs.update(batch_size=loader.batch_size, drop_last=loader.drop_last)
    elif type(loader.batch_sampler) is BatchSampler:  # torch's: torchdata's own records its position
        kwargs.update(sampler=_stateful(loader.batch_sampler.sampler), batch_size=loader.batch_sampler.batch_size,
                      drop_last=loader.batch_sampler.drop_last)
    elif loader.batch_sampler is not None:
        kwargs["batch_sampler"] = loader.batch_sampler
    else:
        kwargs.update(sampler=loader.sampler, batch_size=None)
    dataset = loader.dataset
    if loader.num_workers > 0 and not isinstance(dataset, IterableDataset):
        dataset = WorkerGenerators(dataset)
    return ResumableDataLoader(dataset, **kwargs)
