"""Training loaders that resume mid-epoch exactly: Lightning saves a loader's ``state_dict()`` in
every checkpoint and hands it back on resume (its ``_Stateful`` protocol); a plain ``DataLoader``
has none, so Lightning replays the interrupted epoch from its start.

:func:`resumable` turns a user's plain ``DataLoader`` into a :class:`ResumableDataLoader`, torchdata's
``StatefulDataLoader`` (it records how far the sampler got, worker and dataset state, and fast-forwards
on resume) with two additions that make the continuation equal the uninterrupted run:

* a resumed iterator draws no random number. Making an iterator draws its base seed from torch's
  generator; the uninterrupted run drew it at the epoch's start, before the checkpoint captured the
  generators, so a second draw would shift every dropout mask after the resume.
* a state saved after the epoch's last batch starts the next epoch afresh (its sampler would
  otherwise be fast-forwarded past the end and the next epoch would be empty).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

# torchdata 0.11 calls torch.set_vital in every loader's __init__, which torch 2.14 deprecates:
# noise about the library's internals, once per loader and rank
warnings.filterwarnings("ignore", message="'set_vital' is deprecated", category=UserWarning)


def _batches_yielded(state: dict[str, Any]) -> int | None:
    """How many batches the saved iterator had yielded (single- or multi-process layout)."""
    if "_num_yielded" in state:
        return state["_num_yielded"]
    snapshot = state.get("_snapshot", {}).get("_main_snapshot", {})
    return snapshot.get("_num_yielded")


class ResumableDataLoader(StatefulDataLoader):
    """A ``StatefulDataLoader`` whose resumed iterator draws no random number and whose state,
    once the epoch's last batch is out, resumes at the next epoch's start."""

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        yielded = _batches_yielded(state_dict)
        try:
            length = len(self)
        except TypeError:  # an iterable dataset without a length: trust the state
            length = None
        if yielded is not None and length is not None and yielded >= length:
            return  # saved after the last batch: the next iteration is a new epoch
        super().load_state_dict(state_dict)

    def _get_iterator(self):
        if self.next_iter_state is None:
            return super()._get_iterator()
        with torch.random.fork_rng(devices=[]):  # the resumed epoch's seed was drawn before the checkpoint
            return super()._get_iterator()


def resumable(loader: Any) -> Any:
    """``loader`` as a :class:`ResumableDataLoader` with the same dataset, sampler (Lightning's
    distributed one included), batching, collation and workers; any other object (a stateful
    loader already, a user's own loader class, an iterable) is returned as it is."""
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
    elif loader.batch_sampler is not None:
        kwargs["batch_sampler"] = loader.batch_sampler
    else:
        kwargs.update(sampler=loader.sampler, batch_size=None)
    return ResumableDataLoader(loader.dataset, **kwargs)
