"""(Co-)batches drawn afresh every epoch, one at a time, by a bounded background producer.

GraNNDis' artifact samples its co-batches once and reuses them every epoch; holding an epoch of
sampled subgraphs is O(epoch) memory, and reusing them trains on one fixed sample. Here every
epoch draws new ones from generators seeded by ``(seed, epoch, server or rank, batch)``: a run is
reproducible, and a run resumed at any batch draws exactly what the uninterrupted run drew. A
server samples each co-batch once (``shared``): step ``k``'s on device ``k mod G``, which splits it
by the fixed METIS assignment of the server's vertices and hands each device its part over the
intra-server link; unshared, every device draws the same co-batch from the same seed and keeps
its own part (no traffic, ``G`` times the sampling work).

:class:`BoundedProducer` builds the next batch on a background thread while the current one
trains; at most ``depth`` batches wait and ``depth + 1`` exist at once (being built, waiting,
fetched ahead by Lightning, training), so memory stays O(a few batches), never O(epoch).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from lightning_granndis.graph.batch_schedule import batch_bounds, dealt_to_rank, step_totals, steps_per_epoch
from lightning_granndis.graph.one_hop import OneHopGraph, OneHopSplit
from lightning_granndis.graph.server_subgraph import expansion_subgraph, sampled_subgraph
from lightning_granndis.graph.store.shards import GraphPart, SamplingSource


def epoch_generator(seed: int, epoch: int, stream: int = 0, step: int = 0) -> torch.Generator:
    """A generator for ``(seed, epoch, stream, step)``; distinct keys give independent streams.
    ``step`` keys an epoch's ``step``-th batch (from 1): a resumed epoch draws batch ``k`` without
    drawing the ``k - 1`` before it."""
    key = (int(seed) * 1_000_003 + int(epoch)) * 65_537 + int(stream)
    if step:
        key = (key * 1_000_033 + int(step)) % (1 << 63)
    return torch.Generator().manual_seed(key)


def _part(source: SamplingSource, graph: OneHopGraph, weight: float, train: torch.Tensor | None = None) -> GraphPart:
    """A sampled one-hop graph in the source's local ids → a :class:`GraphPart` in global ids;
    ``train``: its owned rows that are training seeds (default: its seeds)."""
    owned = graph.n_id[: graph.n_owned]

    def gather() -> torch.Tensor:  # on the training thread, when the batch is used
        if source.x_row is None:
            return source.x[owned]
        # MB_base: rows held elsewhere are fetched at the step; blank here
        rows = source.x_row[owned]
        x = torch.zeros(owned.numel(), source.x.shape[1], dtype=source.x.dtype)
        held = rows >= 0
        x[held] = source.x[rows[held]]
        return x

    masks = {"train_mask": (graph.seed if train is None else train).clone()}
    degree = source.degree[graph.n_id]
    graph.n_id = source.n_id[graph.n_id]
    return GraphPart(graph, None, source.y[owned], masks, degree, weight, gather=gather)


def inner_mask(source: SamplingSource) -> torch.Tensor:
    """``[N]`` bool (the source's local ids): the server's inner vertices, whose edges among
    themselves CoB-EAS keeps whole."""
    inside = torch.zeros(source.csr.num_nodes, dtype=torch.bool)
    inside[source.inner] = True
    return inside


@dataclass(frozen=True)
class Batching:
    """How an epoch's seeds are cut into steps (:mod:`~lightning_granndis.graph.batch_schedule`).

    Attributes:
        batch_size: seeds per rank per step (a CoB co-batch: devices x batch_size per server).
        drop_last: full batches only.
        iterations: cut every seed set into this many near-equal batches instead.
    """

    batch_size: int = 1024
    drop_last: bool = False
    iterations: int | None = None


def cob_steps(source: SamplingSource, devices: int, batching: Batching) -> int:
    """Steps of a CoB epoch: the same on every rank (from every server's seed count)."""
    return steps_per_epoch(source.seed_counts, devices * batching.batch_size, batching.drop_last, batching.iterations)


def minibatch_steps(source: SamplingSource, world_size: int, batching: Batching) -> int:
    """Steps of an MB_base epoch: ``ceil(N / (P B))``, as PyG + DDP."""
    return steps_per_epoch([sum(source.seed_counts)], world_size * batching.batch_size, batching.drop_last,
                           batching.iterations)


@dataclass
class CoBatch:
    """One step's co-batch as its sampling device hands it out: ``graphs[d]`` device ``d``'s
    one-hop graph in the source's local ids (``None`` on a device that did not sample this step:
    its part arrives from the one that did), ``total`` the step's seeds over all servers."""

    step: int
    graphs: list[OneHopGraph] | None
    total: int


def cob_part(source: SamplingSource, graph: OneHopGraph, world_size: int, total: int) -> GraphPart:
    """A device's :class:`GraphPart` of a co-batch from its one-hop graph (local ids)."""
    return _part(source, graph, int(graph.seed.sum()) * world_size / max(1, total))


def cob_epoch(source: SamplingSource, server: int, device: int, devices: int, world_size: int,
              fanouts: list[int], batching: Batching, seed: int, epoch: int, start: int = 0,
              keep_inner: bool = False, shared: bool = False) -> Iterator[GraphPart | CoBatch]:
    """Cooperative Batching, one epoch: this device's part of every co-batch of its server (``G``
    x ``batch_size`` seeds), from co-batch ``start`` on (a resumed epoch). ``keep_inner``
    (CoB-EAS): every edge among the server's inner vertices is kept, only the edges leaving the
    server are sampled with ``fanouts``.

    ``shared``: the server samples each co-batch once: step ``k`` by device ``k mod G``, which
    yields a :class:`CoBatch` with every device's graph; the other devices yield one without
    graphs, and the caller hands the parts out (the same co-batches as unshared sampling: the same
    generator draws them, on one device instead of all)."""
    hops = len(fanouts)
    per_step = devices * batching.batch_size
    steps = cob_steps(source, devices, batching)
    seeds = source.seeds[torch.randperm(source.seeds.numel(), generator=epoch_generator(seed, epoch, server))]
    bounds = batch_bounds(seeds.numel(), per_step, steps, batching.iterations)
    totals = step_totals(source.seed_counts, per_step, steps, batching.iterations)
    inside = inner_mask(source) if keep_inner else None
    for it, (lo, hi) in enumerate(bounds):
        if it < start:
            continue
        if shared and it % devices != device:
            yield CoBatch(it, None, totals[it])
            continue
        generator = epoch_generator(seed, epoch, server, step=it + 1)
        sub = sampled_subgraph(source.csr, seeds[lo:hi], fanouts, hops, generator=generator, inside=inside)
        split = OneHopSplit(sub.edge_index, sub.n_id, source.owner[sub.n_id], devices, sub.hop, sub.seed, hops)
        meta = dict(scope="intra", purpose="halo", server=server, iteration=it, epoch=epoch,
                    server_vertices=sub.num_nodes)
        del sub
        if shared:
            graphs = [split.graph(d) for d in range(devices)]
            for graph in graphs:
                graph.meta.update(meta)
            yield CoBatch(it, graphs, totals[it])
            continue
        graph = split.graph(device)
        graph.meta.update(meta)
        yield cob_part(source, graph, world_size, totals[it])


def eas_epoch(source: SamplingSource, server: int, device: int, devices: int, world_size: int, eas_hops: int,
              fanout, weighted: bool, seed: int, epoch: int) -> Iterator[GraphPart]:
    """Expansion-aware Sampling redrawn for ``epoch`` (``resample="epoch"``): the server's inner
    graph whole, its expansion sampled afresh."""
    generator = epoch_generator(seed, epoch, server)
    sub = expansion_subgraph(source.csr, source.inner, eas_hops, fanout, weighted, generator)
    graph = OneHopSplit(sub.edge_index, sub.n_id, source.owner[sub.n_id], devices, sub.hop, sub.seed, None).graph(device)
    graph.meta.update(scope="intra", purpose="halo", server=server, iteration=0, epoch=epoch,
                      server_vertices=sub.num_nodes)
    train = graph.seed & torch.isin(graph.n_id[: graph.n_owned], source.seeds)
    yield _part(source, graph, int(train.sum()) * world_size / max(1, sum(source.seed_counts)), train)


def minibatch_epoch(source: SamplingSource, rank: int, world_size: int, fanouts: list[int], batching: Batching,
                    seed: int, epoch: int, start: int = 0) -> Iterator[GraphPart]:
    """MB_base, one epoch, dealt as PyG + DDP deals it: the training seeds shuffled (the same
    permutation on every rank), step ``k`` the permutation's ``k``-th global batch of ``P`` x
    ``batch_size`` seeds, this rank every ``P``-th of them; its mini-batches with their sampled
    neighbourhoods, from batch ``start`` on."""
    hops = len(fanouts)
    n = sum(source.seed_counts)
    per_step = world_size * batching.batch_size
    steps = minibatch_steps(source, world_size, batching)
    order = source.seeds[torch.randperm(source.seeds.numel(), generator=epoch_generator(seed, epoch))]
    bounds = batch_bounds(n, per_step, steps, batching.iterations)
    for it, (lo, hi) in enumerate(bounds):
        if it < start:
            continue
        batch = dealt_to_rank(order[lo:hi], rank, world_size)
        generator = epoch_generator(seed, epoch, 1 + rank, step=it + 1)
        sub = sampled_subgraph(source.csr, batch, fanouts, hops, generator=generator)
        graph = OneHopGraph(n_owned=sub.num_nodes, n_id=sub.n_id, edge_index=sub.edge_index,
                            send_index=torch.empty(0, dtype=torch.long), send_splits=[0] * world_size,
                            recv_splits=[0] * world_size, hop=sub.hop, seed=sub.seed, exact_hops=hops,
                            halo_hop=torch.empty(0, dtype=torch.long),
                            meta={"scope": "none", "purpose": "halo", "iteration": it, "epoch": epoch})
        part = _part(source, graph, int(sub.seed.sum()) * world_size / max(1, hi - lo))
        part.graph.meta["owner"] = source.owner[part.graph.n_id]
        yield part


class BoundedProducer:
    """Runs ``make()`` (a generator of items) on a background thread, at most ``depth`` items
    ahead of the consumer. Iterate it once; an exception in the producer re-raises in the
    consumer. ``high_water`` records the most items that ever waited.

    With ``alive``, at most that many items exist at once, counting those the consumer still
    uses: the producer starts an item only after the consumer has called :meth:`done` on enough
    earlier ones (a training loop that fetches one batch ahead holds two; ``alive = depth + 1``
    bounds a rank's sampled batches, being built, waiting, fetched ahead and training, to that)."""

    _DONE = object()

    def __init__(self, make: Callable[[], Iterator], depth: int = 2, alive: int | None = None) -> None:
        if depth < 1:
            raise ValueError(f"the producer's depth must be at least 1, got {depth}.")
        if alive is not None and alive < 2:
            raise ValueError(f"alive must be at least 2 (the batch training and the one fetched ahead), got {alive}.")
        self.depth, self.high_water = depth, 0
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._tokens = threading.Semaphore(alive) if alive is not None else None
        self._thread = threading.Thread(target=self._run, args=(make,), daemon=True, name="granndis-sampler")
        self._thread.start()

    def _run(self, make) -> None:
        try:
            items = iter(make())
            while True:
                if not self._acquire():
                    return
                try:
                    item = next(items)
                except StopIteration:
                    break
                if not self._put(item):
                    return
        except BaseException as error:  # handed to the consumer
            self._put(error)
            return
        self._put(self._DONE)

    def _acquire(self) -> bool:
        while self._tokens is not None and not self._stop.is_set():
            if self._tokens.acquire(timeout=0.1):
                return True
        return not self._stop.is_set()

    def done(self, count: int = 1) -> None:
        """The consumer has finished with ``count`` items: as many new ones may be started."""
        if self._tokens is not None:
            for _ in range(count):
                self._tokens.release()

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                self.high_water = max(self.high_water, self._queue.qsize())
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self):
        try:
            while True:
                item = self._queue.get()
                if item is self._DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.close()

    def close(self, timeout: float = 5.0) -> None:
        """Stops the producer after the item it is building; waits up to ``timeout`` seconds."""
        self._stop.set()
        self._thread.join(timeout=timeout)
