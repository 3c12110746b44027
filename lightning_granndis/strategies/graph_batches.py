"""What a GNN strategy's dataloaders yield on each rank: its own one-hop graphs as PyG ``Data``."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from lightning_granndis.graph.epoch_sampling import BoundedProducer
from lightning_granndis.graph.store import GraphPart, GraphStoreHandle


def graph_from_loader(dataloader: object):
    """What a full-batch loader yields (its first batch): the whole graph as a PyG ``Data``, or a
    :class:`~lightning_granndis.graph.store.GraphStoreHandle` of a partitioned one."""
    from torch_geometric.data import Data

    # without a draw from the global generator (a DataLoader's iterator draws its seed): reading
    # the graph is set-up, and the evaluation loader is read after the training loader's iterator
    # is made, where a resumed run has its generators back already
    with torch.random.fork_rng(devices=[]):
        data = next(iter(dataloader))
    if isinstance(data, (list, tuple)) and len(data) == 1:
        data = data[0]
    if isinstance(data, GraphStoreHandle):
        return data
    if not isinstance(data, Data):
        raise TypeError(
            f"the GNN strategies expect dataloaders that yield the whole graph as one torch_geometric Data "
            f"(e.g. OGBNodeDataModule) or a graph store's handle (GraphStoreDataModule), got {type(data).__name__}."
        )
    for key in ("x", "edge_index", "y", "train_mask"):
        if getattr(data, key, None) is None:
            raise ValueError(f"the graph has no `{key}`; the GNN strategies need x, edge_index, y and train_mask.")
    return data


def rank_batch(part: GraphPart, key: int):
    """The rank's (light) batch for ``part``: owned vertex ids ``n_id``, the split masks limited to
    seed vertices, the local ``edge_index`` (sources may be halo rows) and ``granndis_key``.
    Features and labels are added by :func:`materialise` when the batch is used."""
    from torch_geometric.data import Data

    graph = part.graph
    batch = Data(edge_index=graph.edge_index, n_id=graph.n_id[: graph.n_owned].cpu(), num_nodes=graph.n_owned)
    for split, mask in part.masks.items():
        batch[split] = mask
    batch.granndis_key = torch.tensor(key)
    return batch


def materialise(batch, part: GraphPart):
    """A copy of ``batch`` with the features and labels of its rows."""
    out = batch.clone()
    out.x, out.y = part.features(), part.y
    return out


class EpochPosition:
    """How far the current epoch has got, as Lightning checkpoints a loader (``state_dict`` /
    ``load_state_dict``): a resumed epoch starts at the batch after the last one trained."""

    def __init__(self) -> None:
        self.epoch, self.given, self._resume_at = -1, 0, 0

    def begin(self, epoch: int, length: int) -> int:
        """Starts ``epoch``; returns the batch to start from (0, or where a resumed one stood)."""
        start = self._resume_at if self._resume_at and self.epoch == epoch and self._resume_at < length else 0
        self.epoch, self.given, self._resume_at = epoch, start, 0
        return start

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "given": self.given}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self._resume_at = state.get("epoch", -1), state.get("given", 0)


class GraphBatches:
    """A re-iterable, sized sequence of a rank's batches (one epoch); ``epoch()`` numbers the
    epoch being started, for a mid-epoch resume."""

    def __init__(self, batches: list, epoch: Callable[[], int] = lambda: 0) -> None:
        self.batches, self.epoch = batches, epoch
        self.position = EpochPosition()

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        for i in range(self.position.begin(self.epoch(), len(self.batches)), len(self.batches)):
            self.position.given = i + 1
            yield self.batches[i]

    def state_dict(self) -> dict[str, int]:
        return self.position.state_dict()

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position.load_state_dict(state)


class SampledBatches:
    """An epoch of batches drawn afresh each time it is iterated, by a :class:`BoundedProducer`.

    At most ``depth + 1`` sampled batches exist on the rank at once: the producer starts the next
    one only when :meth:`trained` says an earlier one is finished with (and forgotten).

    Args:
        length: batches per epoch.
        parts: ``parts(epoch, start)`` → the epoch's :class:`GraphPart` iterator from batch
            ``start`` on (runs on the producer thread).
        epoch: returns the epoch being started.
        register: ``register(part)`` → the key of a produced part (runs as the batch is consumed);
            ``release(key)`` forgets it once it is trained.
        depth: most batches built ahead.
        deliver: ``deliver(item)`` → the rank's :class:`GraphPart` of a produced item, on the
            training thread as the batch is fetched (a co-batch sampled on one device of the server
            is handed out here, every rank of the server fetching in the same order).
    """

    def __init__(self, length: int, parts: Callable[[int], Iterator[GraphPart]], epoch: Callable[[], int],
                 register: Callable[[GraphPart], int], release: Callable[[int], None], depth: int = 2,
                 deliver: Callable[[object], GraphPart] | None = None) -> None:
        self.length, self.parts, self.epoch, self.deliver = length, parts, epoch, deliver
        self.register, self.release, self.depth = register, release, depth
        self.producer: BoundedProducer | None = None
        self.high_water = 0
        #: most batches held at once (fetched and not yet released), for the memory claim's test
        self.most_held = 0
        self._keys: list[int] = []
        self.position = EpochPosition()

    def __len__(self) -> int:
        return self.length

    def __iter__(self):
        if self.producer is not None:
            self.producer.close()
        for key in self._keys:  # the previous epoch's last batches (Lightning fetches one ahead)
            self.release(key)
        self._keys = []
        epoch = self.epoch()
        start = self.position.begin(epoch, self.length)
        producer = self.producer = BoundedProducer(lambda: self.parts(epoch, start), self.depth,
                                                   alive=self.depth + 1)
        for item in producer:
            self.high_water = max(self.high_water, producer.high_water)
            part = self.deliver(item) if self.deliver is not None else item
            key = self.register(part)
            self._keys.append(key)
            self.most_held = max(self.most_held, len(self._keys) + producer._queue.qsize())
            self.position.given += 1
            yield rank_batch(part, key)

    def close(self, timeout: float = 120.0) -> None:
        """Stops the producer and waits for the batch it is building (a thread left sampling
        when the interpreter exits can abort the process)."""
        if self.producer is not None:
            self.producer.close(timeout)
            self.producer = None

    def trained(self, key: int) -> None:
        """Batch ``key`` is about to train: every batch fetched before it is finished with."""
        if key not in self._keys:
            return
        done = self._keys[: self._keys.index(key)]
        self._keys = self._keys[len(done):]
        for old in done:
            self.release(old)
        if done and self.producer is not None:
            self.producer.done(len(done))

    def state_dict(self) -> dict[str, int]:
        return self.position.state_dict()

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position.load_state_dict(state)
