"""Planning a GNN strategy's training, in one place: which mode, whether it fits, and why.

The strategy hands over what it knows (the graph or a rank's shard, the topology's shape, the
model's widths, the memory budget, the sampling settings) and gets back a :class:`TrainingPlan`
(mode, per-rank memory estimate, the reason in words); it never climbs back into the graph
layer for pieces of the decision.

- :func:`plan_training` (rank 0, an in-memory graph): ``flx`` checked to fit, ``auto`` chosen by
  the paper's cost model (:mod:`~lightning_granndis.graph.cost_model`), other modes as asked;
- :func:`estimate_rank_memory` (every rank, its own shard): what training in the shard's mode
  will hold on this rank: the process as it stands, the shard's arrays, and for a sampled mode
  ``depth + 1`` batches of one sampled batch's measured size (the most a rank holds at once);
- :func:`refuse_unless_fits`: the error naming the estimate, the budget and what fits instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from lightning_granndis.graph.cost_model import ModeChoice, SubgraphSize, choose_mode, memory_bytes
from lightning_granndis.graph.epoch_sampling import Batching, epoch_generator, inner_mask
from lightning_granndis.graph.plan import server_assignment
from lightning_granndis.graph.sampling import CSRGraph
from lightning_granndis.graph.server_subgraph import expansion_subgraph, preloaded_subgraph, sampled_subgraph

MiB = 2**20


@dataclass(frozen=True)
class ModelWidths:
    """What memory and compute scale with: input ``features``, the widest message-passing
    output ``hidden`` (times attention heads) and ``layers``."""

    features: int
    hidden: int
    layers: int


def model_widths(module: torch.nn.Module, features: int, layers: int) -> ModelWidths:
    from lightning_granndis.graph.masking import message_passing_layers

    convs = message_passing_layers(module)
    hidden = max(int(getattr(c, "out_channels", 64)) * int(getattr(c, "heads", 1)) for c in convs)
    return ModelWidths(int(features), hidden, int(layers))


@dataclass(frozen=True)
class PlanRequest:
    """What the strategy asks for.

    Attributes:
        mode: ``auto``, ``flx``, ``eas``, ``cob``, ``minibatch`` or ``full``.
        servers, devices: the topology's shape (``devices`` per server).
        widths: the model's.
        budget: bytes one rank may use.
        eas_hops, eas_fanouts, weighted: EAS's expansion.
        bandwidth_intra, bandwidth_inter: bytes/s per link class (the cost model's ``B``).
        seed, cache_dir: METIS.
    """

    mode: str
    servers: int
    devices: int
    widths: ModelWidths
    budget: int
    eas_hops: int = 1
    eas_fanouts: tuple[int, ...] = (15,)
    weighted: bool = True
    bandwidth_intra: float = 1e11
    bandwidth_inter: float = 4e9
    seed: int = 0
    cache_dir: str | None = None


@dataclass
class TrainingPlan:
    """The mode to train in, the cost model's choice when ``auto`` chose (else ``None``), and the
    estimates behind it (bytes per rank, by mode)."""

    mode: str
    reason: str
    choice: ModeChoice | None = None
    estimates: dict[str, int] = field(default_factory=dict)


def _device_share(subgraphs, devices: int) -> SubgraphSize:
    return SubgraphSize(vertices=max(s.num_nodes for s in subgraphs) // devices + 1,
                        edges=max(int(s.edge_index.shape[1]) for s in subgraphs) // devices + 1)


def plan_training(data, request: PlanRequest, measure_compute: Callable[[], float] | None = None) -> TrainingPlan:
    """The mode to train an in-memory graph in: as asked, ``flx`` after checking that its
    preloaded subgraphs fit, or ``auto``'s choice from the cost model.

    Raises:
        ValueError: ``flx`` does not fit, with the estimate, the budget and the modes that do.
    """
    if request.mode not in ("auto", "flx"):
        return TrainingPlan(request.mode, f"{request.mode}: as asked")
    S, G, w = request.servers, request.devices, request.widths
    graph = CSRGraph.from_edge_index(data.edge_index, data.num_nodes)
    server_of = server_assignment(data.edge_index, data.num_nodes, S, data.train_mask, request.seed, request.cache_dir)
    inner = [(server_of == s).nonzero().flatten() for s in range(S)]
    flx = [preloaded_subgraph(graph, i, w.layers) for i in inner]
    flx_bytes = memory_bytes(_device_share(flx, G), w.features, w.hidden, w.layers)
    if request.mode == "flx":
        if flx_bytes > request.budget:
            raise ValueError(
                f"mode='flx' would preload up to {max(s.num_nodes for s in flx):,} vertices per server "
                f"(~{flx_bytes / 2**30:.2f} GiB per device) but the budget is {request.budget / 2**30:.2f} GiB per "
                "device. Use mode='eas' (sample only the expansion leaving each server) or mode='cob' (server-sized "
                "co-batches), add servers, or raise memory_budget_mb."
            )
        return TrainingPlan("flx", "flx: as asked; its preloaded subgraphs fit", estimates={"flx": flx_bytes})
    gen = torch.Generator().manual_seed(request.seed)
    eas = [expansion_subgraph(graph, i, request.eas_hops, list(request.eas_fanouts), request.weighted, gen)
           for i in inner]
    eas_bytes = memory_bytes(_device_share(eas, G), w.features, w.hidden, w.layers)
    V, E = data.num_nodes, int(data.edge_index.shape[1])
    per_vertex_bytes = 4 * w.hidden * 2 * w.layers  # forward embeddings + backward gradients
    choice = choose_mode(
        V=V, E=E, servers=S, devices=G, C=measure_compute() if measure_compute is not None else 1e6,
        B_intra=request.bandwidth_intra / per_vertex_bytes, B_inter=request.bandwidth_inter / per_vertex_bytes,
        R_flx=sum(s.num_nodes for s in flx) / V, R_eas=sum(s.num_nodes for s in eas) / V,
        flx_bytes=flx_bytes, eas_bytes=eas_bytes, budget=request.budget,
    )
    return TrainingPlan(choice.mode, f"mode=auto chose {choice.reason}", choice,
                        estimates={"flx": flx_bytes, "eas": eas_bytes})


def measure_compute(module: torch.nn.Module, data, device: torch.device, sample: int = 20000) -> float:
    """``C`` in vertices/s: one forward + backward of ``module`` on an induced subgraph of the
    first ``sample`` vertices (after a warm-up)."""
    from torch_geometric.utils import subgraph

    n = min(sample, data.num_nodes)
    edge_index, _ = subgraph(torch.arange(n), data.edge_index, num_nodes=data.num_nodes)
    x, edge_index = data.x[:n].to(device), edge_index.to(device)
    module(x, edge_index).sum().backward()  # warm-up
    t0 = time.perf_counter()
    module(x, edge_index).sum().backward()
    seconds = time.perf_counter() - t0
    for p in module.parameters():
        p.grad = None
    return n / max(seconds, 1e-9)


# ---------------------------------------------------------------------- a rank's memory
@dataclass
class MemoryEstimate:
    """A rank's estimated peak, in bytes, and its parts. ``retained``: what the C library's heap
    keeps of earlier batches when freed memory is not given back (``release_host_memory``; on a
    host only): measured as about one more batch's training."""

    process: int
    shard: int
    batches: int
    training: int
    batch_vertices: int = 0
    batch_edges: int = 0
    retained: int = 0
    #: ``training`` with trimmed layers (a sampled mode; ``0``: not possible)
    training_trimmed: int = 0
    layers_trimmed: bool = False

    @property
    def total(self) -> int:
        return self.process + self.shard + self.batches + self.training + self.retained

    def released(self) -> "MemoryEstimate":
        """The estimate when freed batches leave the process."""
        return replace(self, retained=0)

    def trimmed(self) -> "MemoryEstimate":
        """The estimate with trimmed layers (``trim_layers``): a batch's training follows the
        rows each layer computes; the heap keeps about one batch of that."""
        if not self.training_trimmed:
            return self
        return replace(self, training=self.training_trimmed, layers_trimmed=True,
                       retained=self.training_trimmed if self.retained else 0)

    def describe(self) -> str:
        parts = (f"process {self.process / MiB:,.0f} MB + shard {self.shard / MiB:,.0f} MB + batches "
                 f"{self.batches / MiB:,.0f} MB + training {self.training / MiB:,.0f} MB")
        if self.retained:
            parts += f" + heap-retained {self.retained / MiB:,.0f} MB"
        if self.batch_vertices:
            parts += f"; one batch ~{self.batch_vertices:,} vertices, {self.batch_edges:,} edges"
        if self.layers_trimmed:
            parts += "; layers trimmed"
        return f"~{self.total / MiB:,.0f} MB per rank ({parts})"


def trim_needed(estimate: MemoryEstimate, budget: int, asked: bool | None) -> bool:
    """Whether to trim layers (a sampled mode only). ``asked``: the user's ``True`` / ``False``;
    ``None`` (auto): only when the untrimmed estimate, the heap's keep included, would not fit
    ``budget`` (trimming is tried before releasing memory: it makes steps faster, not slower;
    it stays opt-in otherwise, since a model that combines rows across layers must then slice)."""
    if not estimate.training_trimmed:
        return False
    return asked if asked is not None else estimate.total > budget


def release_needed(estimate: MemoryEstimate, budget: int, asked: bool | None) -> bool:
    """Whether to give freed batch memory back to the system (slower: every batch's pages are
    faulted in afresh; 1.6x the step time measured on synthetic-arxiv). ``asked``: the user's
    ``True`` / ``False``; ``None`` (auto): only when keeping the heap would not fit ``budget``."""
    if asked is not None:
        return asked and estimate.retained > 0
    return estimate.retained > 0 and estimate.total > budget


def process_bytes() -> int:
    """What this process holds now (resident set): the interpreter, the libraries, whatever the
    datamodule loaded."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096
    except OSError:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _tensor_bytes(obj, seen: set[int]) -> int:
    """Bytes of the distinct tensors reachable through ``obj``'s fields (dataclasses, dicts,
    lists); a memory-mapped tensor counts in full: training reads all of it over an epoch."""
    if isinstance(obj, torch.Tensor):
        if obj.is_sparse_csr:
            return sum(_tensor_bytes(t, seen) for t in (obj.crow_indices(), obj.col_indices(), obj.values()))
        key = obj.untyped_storage().data_ptr()
        if key in seen:
            return 0
        seen.add(key)
        return obj.untyped_storage().nbytes()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v, seen) for v in obj)
    if hasattr(obj, "__dataclass_fields__"):
        return sum(_tensor_bytes(getattr(obj, f), seen) for f in obj.__dataclass_fields__)
    return 0


def batch_bytes(vertices: int, owned: int, edges: int, widths: ModelWidths, lean: bool = True,
                fetched: int = 0) -> tuple[int, int]:
    """``(held, training)`` bytes of one sampled batch part: what it holds while it waits (ids,
    edges, hops, masks, degree rows) and what training it adds: its features; per layer the
    sparse adjacency and its transpose on the lean path (else one message per edge and
    channel); per layer and row the aggregated input and, per output channel, about six
    values (the two linear outputs and their sum, the activation, dropout's output and mask,
    the gradient being formed: measured 5.9 KB per row for SAGE 128 -> 64 x 3); and for
    ``fetched`` rows fetched from other ranks, the rows received and as many served."""
    held = vertices * (8 + 8 + 1 + 24) + edges * 16
    w = widths
    per_layer_edges = 16 if lean else 8 * w.hidden
    per_row = w.features + (w.features + (w.layers - 1) * w.hidden) + 6 * w.hidden * w.layers
    training = owned * 4 * per_row + edges * per_layer_edges * w.layers + 2 * fetched * 4 * w.features
    return held, training


def trimmed_training_bytes(owned: int, layer_rows: list[int], layer_edges: list[int], widths: ModelWidths,
                           fetched: int = 0) -> int:
    """What training one batch part adds with trimmed layers: its features (every row: the first
    layer reads them all), per layer ``k`` for the ``layer_rows[k]`` rows it computes the
    aggregated input and about six values per output channel (as :func:`batch_bytes`), its
    ``layer_edges[k]`` edges' sparse adjacency and transpose, the last output padded back to a row
    per vertex (and its gradient), and the rows fetched from other ranks."""
    w = widths
    values = owned * w.features + 2 * owned * w.hidden
    for k, rows in enumerate(layer_rows):
        values += rows * ((w.features if k == 0 else w.hidden) + 6 * w.hidden)
    return 4 * values + 16 * sum(layer_edges) + 2 * fetched * 4 * w.features


def _layer_counts(hop: torch.Tensor, edge_index: torch.Tensor, layers: int, parts: int) -> tuple[list[int], list[int]]:
    """Rows and edges each trimmed layer computes over (layer ``k``: targets within ``L - 1 - k``
    hops), per part of ``parts``."""
    dst_hop = hop[edge_index[1]]
    rows = [int((hop <= layers - 1 - k).sum()) // parts + 1 for k in range(layers)]
    edges = [int((dst_hop <= layers - 1 - k).sum()) // parts + 1 for k in range(layers)]
    return rows, edges


def estimate_rank_memory(shard, mode: str, widths: ModelWidths, fanouts: list[int], batching: Batching,
                         devices: int, depth: int, process: int, on_host: bool = True,
                         evaluates: bool = True, seed: int = 0, world: int = 1,
                         keep_inner: bool = False) -> MemoryEstimate:
    """The most this rank will hold training its ``shard`` (a
    :class:`~lightning_granndis.graph.store.RankShard`) in ``mode``: ``process`` (what it held
    before the shard, :func:`process_bytes`), the shard's arrays, and for a sampled mode
    ``depth + 1`` batches held plus one batch training, each sized by sampling one batch now
    (``fanouts``, ``batching``) from the shard's source. ``on_host=False`` (a GPU): the device
    holds the batches and training only. ``evaluates``: the fit validates, reading the shard's
    part of the exact evaluation split too (a store's is memory-mapped: untouched otherwise).
    ``world``: ranks an MB_base batch's features are fetched from (all but this rank's share).
    A sampled mode on a host also gets ``retained``, the heap's keep (:func:`release_needed`).
    ``keep_inner`` (CoB-EAS): the co-batch keeps every edge among the server's inner vertices."""
    seen: set[int] = set()
    shard_bytes = _tensor_bytes(shard.source, seen) + _tensor_bytes(shard.train, seen)
    if evaluates or shard.source is None:
        shard_bytes += _tensor_bytes(shard.eval, seen)
    if not on_host:
        process = shard_bytes = 0
    if shard.source is None or mode == "eas":
        parts = shard.train or [shard.eval]
        graph = max(parts, key=lambda p: p.graph.n_id.numel()).graph
        _, training = batch_bytes(int(graph.n_id.numel()), graph.n_owned, int(graph.edge_index.shape[1]), widths)
        return MemoryEstimate(process, shard_bytes, 0, training)
    source = shard.source
    generator = epoch_generator(seed, 0, 10_007)
    if mode == "minibatch":
        count = min(batching.batch_size, source.seeds.numel())
        seeds = source.seeds[torch.randperm(source.seeds.numel(), generator=generator)[:count]]
        sub = sampled_subgraph(source.csr, seeds, fanouts, len(fanouts), generator=generator)
        vertices, owned, edges = sub.num_nodes, sub.num_nodes, int(sub.edge_index.shape[1])
        fetched = vertices * (world - 1) // max(world, 1)
        layer_rows, layer_edges = _layer_counts(sub.hop, sub.edge_index, len(fanouts), 1)
    else:
        count = min(devices * batching.batch_size, source.seeds.numel())
        seeds = source.seeds[torch.randperm(source.seeds.numel(), generator=generator)[:count]]
        sub = sampled_subgraph(source.csr, seeds, fanouts, len(fanouts), generator=generator,
                               inside=inner_mask(source) if keep_inner else None)
        # a device's part: its share of the co-batch's vertices plus the halo it receives
        vertices, edges = sub.num_nodes // devices + 1, int(sub.edge_index.shape[1]) // devices + 1
        owned, fetched = vertices, 0
        layer_rows, layer_edges = _layer_counts(sub.hop, sub.edge_index, len(fanouts), devices)
    held, training = batch_bytes(vertices, owned, edges, widths, fetched=fetched)
    trimmed = trimmed_training_bytes(owned, layer_rows, layer_edges, widths, fetched)
    retained = training if on_host else 0
    return MemoryEstimate(process, shard_bytes, (depth + 1) * held, training, vertices, edges, retained, trimmed)


def refuse_unless_fits(estimates: list[MemoryEstimate], budget: int, mode: str, strategy: str) -> None:
    """Raises (the same on every rank, given every rank's estimate) when a rank will not fit.

    Raises:
        MemoryError: naming the rank, its estimate, the budget and what to do.
    """
    worst = max(range(len(estimates)), key=lambda r: estimates[r].total)
    estimate = estimates[worst]
    if estimate.total <= budget:
        return
    fix = {
        "minibatch": "lower batch_size or fanout (a batch's size follows them), or use granndis with mode='cob'",
        "cob": "lower batch_size or fanout (a co-batch's size follows them), or add servers",
        "eas": ("use mode='cob' (server-sized co-batches: memory follows batch_size; from a store, partition it with "
                "--mode cob) or add servers (each server's expansion-aware subgraph is too big)"),
        "flx": "use mode='cob' or mode='eas', or add servers",
        "full": "use granndis (mode='cob') or gnn_mb_base, or add ranks",
    }.get(mode, "choose a sampled mode (cob) or add servers")
    if estimate.training_trimmed and not estimate.layers_trimmed:
        fix = "set trim_layers=True (each layer computes only the rows it still needs), " + fix
    raise MemoryError(
        f"{strategy}: training in mode={mode!r} would need {estimate.describe()} on rank {worst}, but the budget is "
        f"{budget / MiB:,.0f} MB per rank (memory_budget_mb, default 80% of free memory shared by the local ranks). "
        f"To fit: {fix}; or raise memory_budget_mb if the memory is there."
    )
