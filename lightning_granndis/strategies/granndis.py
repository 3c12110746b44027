"""GraNNDis: server-aware distributed GNN training as a Lightning strategy."""

from __future__ import annotations

import time
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.model_helpers import is_overridden
from typing_extensions import override

from lightning_granndis import comm
from lightning_granndis.host_memory import release_freed_memory
from lightning_granndis.graph.cost_model import ModeChoice, available_memory
from lightning_granndis.graph.batch_norm import DistributedBatchNorm
from lightning_granndis.graph.masking import OneHopMasking, message_passing_layers
from lightning_granndis.graph.one_hop import OneHopGraph
from lightning_granndis.graph.batch_schedule import check_batch_size, describe
from lightning_granndis.graph.epoch_sampling import Batching, CoBatch, cob_epoch, cob_part, cob_steps, eas_epoch
from lightning_granndis.graph.fanouts import check_fanout_type, resolve_fanouts
from lightning_granndis.graph.plan import PlanConfig
from lightning_granndis.graph.quantise import quantised_exchange
from lightning_granndis.graph.training_plan import (
    MemoryEstimate,
    PlanRequest,
    estimate_rank_memory,
    measure_compute,
    model_widths,
    plan_training,
    process_bytes,
    refuse_unless_fits,
    release_needed,
    trim_needed,
)
from lightning_granndis.graph.validation import validate_graph
from lightning_granndis.graph.store import (
    GraphPart,
    GraphStoreError,
    GraphStoreHandle,
    RankShard,
    build_shards,
    load_rank_shard,
    store_params,
)
from lightning_granndis.strategies.graph_batches import (
    GraphBatches,
    SampledBatches,
    graph_from_loader,
    materialise,
    rank_batch,
)
from lightning_granndis.strategies.seed_weighted_logging import seed_weighted_logging
from lightning_granndis.strategies.server_aware_ddp import ServerAwareDDPStrategy

MODES = ("auto", "flx", "cob", "eas")


class ServerAwareGNNStrategy(ServerAwareDDPStrategy):
    """`GraNNDis: Fast Distributed Graph Neural Network Training Framework for Multi-Server Clusters
    <https://doi.org/10.1145/3656019.3676892>`_ (PACT'24).

    The graph is split across servers (METIS). No vertex feature or embedding crosses servers
    during forward or backward; only gradients do, hierarchically. Inside a server its devices
    train one server-sized (co-)batch together, exchanging one-hop halos over the fast intra-server
    link before every message-passing layer (One-Hop Graph Masking). Modes:

    - ``flx`` — Flexible Preloading, full batch: each server holds its inner vertices plus every
      vertex they depend on within ``L`` hops. Exact: equals single-process full-graph training.
    - ``cob`` — Cooperative Batching: per step a server-sized co-batch of exactly
      ``G * batch_size`` training seeds (the last one partial unless ``drop_last``), its sampled
      ``L``-hop neighbourhood (``fanout``: PyG's ``num_neighbors``, default 25 per hop), split
      across the server's devices. Co-batches are drawn afresh every epoch (seeded by epoch) by a
      bounded background producer; the artifact samples them once. ``cob_sampling="eas"``
      (CoB-EAS) keeps every edge inside the server and samples only those leaving it.
    - ``eas`` — Expansion-aware Sampling: all edges inside the server kept, only the expansion
      leaving it sampled: ``eas_hops`` hops (default 1), ``eas_fanout`` (default 15) external
      neighbours per vertex, chosen degree-aware (``eas_sampling="degree"``) or uniformly.
    - ``auto`` — chooses from the paper's cost model (Eqs. 1–5, see
      :mod:`lightning_granndis.graph.cost_model`) and says which and why.

    The loss covers only the seed (inner) vertices a rank owns, reweighted so that the gradient is
    the mean over all seeds of the (co-)batch, as in single-process training. A scalar the module
    logs in ``training_step`` (its loss, an accuracy) is taken as a mean over the rank's seeds and
    logged as the mean over all seeds, on every rank: what single-process training logs
    (:mod:`~lightning_granndis.strategies.seed_weighted_logging`). Validation and test
    run exact full-graph inference (the graph split across all ranks, halos exchanged among all of
    them, booked as ``eval``); each rank counts its correct vertices and the sums give
    ``val_acc``/``test_acc`` — the module's own ``validation_step``/``test_step`` are not
    called (``exact_eval=False`` runs them on the rank's local graph instead).

    The graph comes from the datamodule's loader: a PyG ``Data`` every rank holds (rank 0 builds
    the plans and hands each rank its own), or a graph store's handle
    (:class:`~lightning_granndis.datamodules.GraphStoreDataModule`, ``granndis partition``), from
    which each rank memory-maps only its own server's shard.

    Args:
        servers: number of servers (default: one per node; ``servers=S`` makes virtual ones).
        mode: ``auto`` (default), ``flx``, ``cob`` or ``eas``.
        hops: ``L`` for preloading and masks (default: the model's number of message-passing layers).
        fanout: neighbours sampled per hop, PyG's ``num_neighbors``: a list with one entry per
            message-passing layer (``[15, 10, 5]``: 15 of every seed, 10 a hop out, ...; ``-1`` =
            all), or one int for every hop (default 25, the paper's CoB). A list of the wrong length
            is refused at set-up, naming the model's layer count.
        eas_fanout: EAS external neighbours per expansion hop (a list of ``eas_hops`` entries, or
            an int; default: ``fanout`` when that is an int, else 15).
        eas_hops: EAS expansion hops ``h`` (default 1).
        eas_sampling: ``"degree"`` (default) or ``"uniform"``.
        cob_sampling: ``"fanout"`` (default: GraphSAGE's per-hop fan-out) or ``"eas"`` (CoB-EAS:
            edges inside the server all kept, ``fanout`` applies to those leaving it).
        batch_size: seeds per device (rank) per step (default 1024): a CoB co-batch is ``G *
            batch_size`` seeds of one server, as NeighborLoader + DDP's global batch is ``P *
            batch_size``.
        drop_last: drop each epoch's last, partial batch (default ``False``).
        iterations: cut every epoch into this many near-equal (co-)batches instead (the
            artifact's ``--epoch-iter``; overrides ``batch_size``).
        exact_eval: exact, gathered OGB evaluation (default ``True``).
        sparse_aggregation: hand convs that support it (``SAGEConv``, ``GCNConv``, ``GraphConv``,
            ``GINConv``...) a ``torch.sparse`` CSR adjacency, so no ``[E, F]`` message tensor is
            built (default ``True``); others (``GATConv``) keep ``edge_index``. Same results.
        halo_bits: quantise halo messages to 2, 4 or 8 bits (AdaQP-style; default off).
        memory_budget_mb: per-device memory budget for the mode checks (default: 80% of the GPU,
            or of free RAM shared by the local ranks).
        release_host_memory: in CoB and MB_base on a host, hold glibc's mmap threshold fixed so a
            batch's freed tensors leave the process (:mod:`lightning_granndis.host_memory`):
            ``None`` (default) when the memory estimate would not fit the budget otherwise (each
            batch's pages are then faulted in afresh: slower), ``True`` always, ``False`` never.
        trim_layers: in CoB and MB_base, layer ``k`` of ``L`` computes only the rows within
            ``L - 1 - k`` hops of the seeds (PyG's ``trim_to_layer``; the seeds' outputs are the
            same, a batch's activations shrink hop by hop): ``None`` (default) when the memory
            estimate would not fit the budget otherwise, ``True`` always, ``False`` never. The rows
            passed between layers then shrink too: a model that adds or concatenates rows across
            layers (residuals, jumping knowledge) must slice them (``x[:h.size(0)] + h``); the
            last layer's output has a row per vertex again (zeros past the seeds' hops).
        resample: ``"once"`` (default; the paper's EAS) or ``"epoch"``: EAS draws a fresh
            expansion every epoch.
        sampler_depth: most (co-)batches the background producer builds ahead (default 2); at most
            ``sampler_depth + 1`` sampled batches exist on a rank at once.
        share_sampling: CoB samples each co-batch once per server, on one of its devices in turn,
            and hands the parts out over the intra-server link (default ``True``; ``False``: every
            device samples the whole co-batch and keeps its part: no traffic, ``G`` times the work).
            The same co-batches either way.
        store_checksum: verify a store's SHA-256 when loading it (default ``True``; sizes are
            always checked).
        seed: random seed of partitioning and sampling.
        cache_dir: METIS cache directory (default none).
        link_model, emulate, hierarchical, **kwargs: as :class:`ServerAwareDDPStrategy`.
    """

    strategy_name = "granndis"
    default_mode = "auto"
    #: exchange group and ledger purpose of the training halo
    halo_scope = "intra"

    def __init__(
        self,
        servers: int | None = None,
        mode: str | None = None,
        hops: int | None = None,
        fanout: int | list[int] | None = None,
        eas_hops: int = 1,
        eas_sampling: str = "degree",
        batch_size: int = 1024,
        iterations: int | None = None,
        drop_last: bool = False,
        eas_fanout: int | list[int] | None = None,
        cob_sampling: str = "fanout",
        exact_eval: bool = True,
        sparse_aggregation: bool = True,
        resample: str = "once",
        sampler_depth: int = 2,
        share_sampling: bool = True,
        store_checksum: bool = True,
        halo_bits: int | None = None,
        memory_budget_mb: float | None = None,
        release_host_memory: bool | None = None,
        trim_layers: bool | None = None,
        seed: int = 0,
        cache_dir: str | None = None,
        link_model: Any = "granndis_paper",
        emulate: bool = False,
        hierarchical: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(servers=servers, link_model=link_model, emulate=emulate, hierarchical=hierarchical, **kwargs)
        mode = mode or self.default_mode
        if mode not in self.modes():
            raise ValueError(f"{type(self).__name__}: unknown mode {mode!r}; choose one of {', '.join(self.modes())}.")
        if eas_sampling not in ("degree", "uniform"):
            raise ValueError(f"eas_sampling must be 'degree' or 'uniform', got {eas_sampling!r}.")
        if halo_bits not in (None, 2, 4, 8):
            raise ValueError(f"halo_bits must be 2, 4 or 8 (or None for full precision), got {halo_bits!r}.")
        if hops is not None and hops < 1:
            raise ValueError(f"hops must be at least 1, got {hops}.")
        if cob_sampling not in ("fanout", "eas"):
            raise ValueError(f"cob_sampling must be 'fanout' or 'eas', got {cob_sampling!r}.")
        check_fanout_type(fanout, "fanout")
        check_fanout_type(eas_fanout, "eas_fanout")
        check_batch_size(batch_size, iterations)
        fanout = list(fanout) if fanout is not None and not isinstance(fanout, int) else fanout
        eas_fanout = list(eas_fanout) if eas_fanout is not None and not isinstance(eas_fanout, int) else eas_fanout
        self.mode = mode
        self.hops = hops
        self.fanout, self.eas_hops, self.eas_sampling = fanout, eas_hops, eas_sampling
        self.eas_fanout = eas_fanout if eas_fanout is not None else (fanout if isinstance(fanout, int) else None)
        self.cob_sampling = cob_sampling
        self.batch_size, self.iterations = batch_size, iterations
        self.batching = Batching(batch_size, bool(drop_last), iterations)
        #: per-hop fan-outs (sampled modes) and EAS expansion fan-outs, resolved at set-up
        self.fanouts: list[int] = []
        self.eas_fanouts: list[int] = []
        self.exact_eval, self.halo_bits = exact_eval, halo_bits
        self.sparse_aggregation = sparse_aggregation
        if resample not in ("once", "epoch"):
            raise ValueError(f"resample must be 'once' or 'epoch', got {resample!r}.")
        if resample == "epoch" and mode not in ("eas", "auto"):
            raise ValueError(f"resample='epoch' applies to mode='eas' (CoB and MB_base draw afresh every epoch "
                             f"anyway), got mode={mode!r}.")
        self.resample, self.sampler_depth, self.store_checksum = resample, sampler_depth, store_checksum
        self.share_sampling = share_sampling
        self.memory_budget_mb, self.seed, self.cache_dir = memory_budget_mb, seed, cache_dir
        self.release_host_memory = release_host_memory
        self.trim_layers = trim_layers
        #: whether CoB / MB_base layers are trimmed in this fit (decided before the first step)
        self.layers_trimmed = False
        #: whether freed batch memory goes back to the system in this fit (decided before the first step)
        self.host_memory_released = False
        self.choice: ModeChoice | None = None
        #: this rank's estimated peak for its training shard (set before the first step)
        self.memory_estimate: MemoryEstimate | None = None
        self.resolved_mode: str | None = None if mode == "auto" else mode
        self.last_eval: dict[str, float] = {}
        self._masking: OneHopMasking | None = None
        self._batch_norm: DistributedBatchNorm | None = None
        self._shards: dict[tuple, RankShard] = {}
        self._parts: dict[int, GraphPart] = {}
        self._graphs: dict[int, OneHopGraph] = {}
        self._next_key = 0
        self._sampled: SampledBatches | None = None
        #: seconds this rank spent getting its shard, by loader kind ("train", "eval"): loading it
        #: from a store, or building and handing out plans
        self.shard_seconds: dict[str, float] = {}
        self._data = None

    @classmethod
    def modes(cls) -> tuple[str, ...]:
        return MODES

    # ------------------------------------------------------------------ set-up
    @override
    def setup(self, trainer) -> None:
        super().setup(trainer)
        layers = message_passing_layers(self.lightning_module)
        self.num_layers = self.hops or len(layers)
        # on every rank, before any shard is built: every rank holds the model, so all refuse alike
        what = (f"the model's {len(layers)} message-passing layers" if self.hops is None
                else f"hops={self.hops} (the model has {len(layers)} message-passing layers)")
        self.fanouts = resolve_fanouts(self.fanout, self.num_layers, 25, "fanout", what)
        self.eas_fanouts = resolve_fanouts(self.eas_fanout, self.eas_hops, 15, "eas_fanout",
                                           f"eas_hops={self.eas_hops} expansion hops")
        self._masking = OneHopMasking(self.lightning_module, self._exchange, num_layers=self.num_layers,
                                      sparse_aggregation=self.sparse_aggregation)
        self._batch_norm = DistributedBatchNorm(self.lightning_module, self._norm_context, self.strategy_name)

    @override
    def teardown(self) -> None:
        if self._sampled is not None:  # a fit stopped mid-epoch leaves the producer sampling
            self._sampled.close()
        if self._masking is not None:
            self._masking.remove()
            self._masking = None
        if self._batch_norm is not None:
            self._batch_norm.remove()
            self._batch_norm = None
        super().teardown()

    def _norm_context(self):
        """Which rows a BatchNorm1d's statistics cover, and over which ranks: the whole graph's
        vertices, each once (the seed rows of every rank) in full-batch training and in exact
        evaluation; a CoB co-batch's sampled vertices over the server's devices; an MB_base
        mini-batch on its own rank (mini-batch semantics, as in one process)."""
        graph = self._masking.graph if self._masking is not None else None
        if graph is None:
            return None
        training = self.lightning_module.trainer.training
        mode = self.resolved_mode if training else "eval"
        if mode == "minibatch":
            return None  # the rank's own mini-batch: BatchNorm1d as it is
        if mode == "cob":
            group = self._server_group()
            counted = None  # every row the layer computed (with trimmed layers: fewer at each layer)
        else:
            group, counted = None, graph.seed
        return counted, lambda t: self.comm.all_reduce_autograd(t, "other", group)

    @override
    def process_dataloader(self, dataloader: object) -> object:
        batches = self._rank_batches(dataloader)
        self.restore_resumed_random_state()
        return batches

    def _rank_batches(self, dataloader: object) -> object:
        """This rank's batches of the loader's graph (its shard's parts, or its sampler)."""
        trainer = self.lightning_module.trainer
        kind = "train" if trainer.training else "eval"
        shard = self._shard_for(graph_from_loader(dataloader), kind)
        if kind == "eval":
            return GraphBatches([rank_batch(shard.eval, self._register(shard.eval))])
        if shard.source is not None:
            length = 1 if self.resolved_mode == "eas" else self._steps_per_epoch(shard.source)
            self._sampled = SampledBatches(length, lambda epoch, start: self._epoch_parts(shard, epoch, start),
                                           lambda: self.lightning_module.trainer.current_epoch, self._register,
                                           self._release, depth=self.sampler_depth,
                                           deliver=lambda item: self._deliver(shard, item))
            return self._sampled
        return GraphBatches([rank_batch(part, self._register(part)) for part in shard.train],
                            lambda: self.lightning_module.trainer.current_epoch)

    def _register(self, part: GraphPart) -> int:
        key = self._next_key
        self._next_key += 1
        if part.graph.n_id.device != self.root_device:
            part.graph = part.graph.to(self.root_device)
        part.graph.meta["degree_stats"] = part.degree
        self._parts[key] = part
        self._graphs[key] = part.graph
        return key

    def _release(self, key: int) -> None:
        self._parts.pop(key, None)
        self._graphs.pop(key, None)

    def _steps_per_epoch(self, source) -> int:
        """(Co-)batches per epoch, said once at the start of ``fit``."""
        G = self.topology.devices_per_server
        steps = cob_steps(source, G, self.batching)
        self._say_steps(steps, sum(source.seed_counts), G * self.batch_size)
        return steps

    def _say_steps(self, steps: int, seeds: int, co_batch: int | None) -> None:
        if steps < 1:
            raise ValueError(f"{self.strategy_name}: drop_last=True leaves no full batch of this graph's {seeds:,} "
                             f"training seeds (batch_size={self.batch_size} on {self.world_size} ranks); lower "
                             "batch_size or set drop_last=False.")
        if getattr(self, "_said_steps", None) != steps:
            self._said_steps = steps
            rank_zero_info(f"{self.strategy_name}: " + describe(steps, seeds, self.world_size, self.batch_size,
                                                                self.batching.drop_last, co_batch))

    def _epoch_parts(self, shard: RankShard, epoch: int, start: int = 0):
        """The epoch's freshly drawn parts of this rank from batch ``start`` on (on the producer
        thread)."""
        topo = self.topology
        if self.resolved_mode == "eas":  # one batch an epoch: a resume starts at 0
            return eas_epoch(shard.source, shard.server, shard.device, topo.devices_per_server, topo.world_size,
                             self.eas_hops, self.eas_fanouts, self.eas_sampling == "degree", self.seed, epoch)
        return cob_epoch(shard.source, shard.server, shard.device, topo.devices_per_server, topo.world_size,
                         self.fanouts, self.batching, self.seed, epoch, start, keep_inner=self.cob_sampling == "eas",
                         shared=self.share_sampling and topo.devices_per_server > 1)

    def _deliver(self, shard: RankShard, item):
        """This device's part of a co-batch its server sampled once: device ``k mod G`` of the
        server hands step ``k``'s parts out over the intra-server link (booked as ``sampling``)."""
        if not isinstance(item, CoBatch):
            return item
        G = self.topology.devices_per_server
        src = shard.server * G + item.step % G
        graph = self.comm.scatter_object(item.graphs, src, "sampling", self._server_group())
        return cob_part(shard.source, graph, self.world_size, item.total)

    def _shard_for(self, item, kind: str) -> RankShard:
        """This rank's shard for the loader's graph (or store): loaded from the store, or built by
        rank 0 from a graph every rank holds and handed out. A collective in the second case."""
        store = isinstance(item, GraphStoreHandle)
        # a training shard also serves evaluation on the same graph
        own = (id(item), "store" if store else kind)
        for key in [own] + ([(id(item), "train")] if kind == "eval" else []):
            if key in self._shards:
                return self._shards[key]
        t0 = time.perf_counter()
        process = process_bytes()  # before the shard: a shard held in memory counts once
        shard = self._load_store(item) if store else self._build_in_memory(item, kind)
        self.shard_seconds[kind] = time.perf_counter() - t0
        rank_zero_info(f"granndis: {kind} shards ready in {self.shard_seconds[kind]:.1f}s")
        if kind == "train":
            self._check_memory(shard, process)
        self._shards = {own: shard}  # one graph at a time
        self._data = item
        return shard

    def _store_params(self, mode: str) -> dict:
        topo = self.topology
        return store_params(mode, topo.servers, topo.devices_per_server, self.num_layers, self.eas_fanouts,
                            self.eas_hops, self.eas_sampling, self.batch_size, self.iterations, self.seed, self.resample)

    def _load_store(self, handle: GraphStoreHandle) -> RankShard:
        made = handle.manifest["params"]["mode"]
        mode = made if self.mode == "auto" and made in ("flx", "eas", "cob") else self.mode
        try:
            shard = load_rank_shard(handle.directory, self.global_rank, self.world_size, self._store_params(mode),
                                    checksum=self.store_checksum)
            error = None
        except GraphStoreError as caught:
            shard, error = None, caught
        # a bad store is reported on every rank, not only on those whose shard was bad
        errors = [e for e in comm.gather_objects(None if error is None else str(error)) if e]
        if errors:
            raise GraphStoreError(errors[0])
        self.resolved_mode = mode
        if mode in ("flx", "eas", "cob") and self.choice is None and self.mode == "auto":
            rank_zero_info(f"granndis: mode=auto uses the store's mode {mode!r}")
        return shard

    def _build_in_memory(self, data, kind: str) -> RankShard:
        validate_graph(data, name="the datamodule's graph")
        objs = None
        if self.global_rank == 0:
            t0 = time.perf_counter()
            try:
                mode = self._train_mode(data) if kind == "train" else "full"
                shards = [sh for server in build_shards(data, self._plan_config(mode), progress=True)
                          for sh in server]
                objs = [(sh, self.choice, mode) for sh in shards]
            except Exception as error:  # every rank raises it, instead of waiting for a plan forever
                objs = [error] * self.world_size
            rank_zero_info(f"granndis: {kind} plan for {self.world_size} ranks built in {time.perf_counter() - t0:.1f}s")
        received = comm.scatter_objects(objs)
        if isinstance(received, Exception):
            raise received
        shard, choice, mode = received
        if kind == "train":
            self.choice, self.resolved_mode = choice, mode
        return shard

    # ------------------------------------------------------------------ plans (rank 0, in-memory graphs)
    def _plan_config(self, mode: str) -> PlanConfig:
        topo = self.topology
        return PlanConfig(mode=mode, servers=topo.servers, devices_per_server=topo.devices_per_server,
                          hops=self.num_layers, fanout=self.eas_fanouts, eas_hops=self.eas_hops,
                          weighted=self.eas_sampling == "degree", batch_size=self.batch_size,
                          iterations=self.iterations, seed=self.seed, cache_dir=self.cache_dir, resample=self.resample)

    def _plan_request(self, mode: str, features: int) -> PlanRequest:
        topo = self.topology
        return PlanRequest(mode=mode, servers=topo.servers, devices=topo.devices_per_server,
                           widths=model_widths(self.lightning_module, features, self.num_layers),
                           budget=self._budget(), eas_hops=self.eas_hops, eas_fanouts=tuple(self.eas_fanouts),
                           weighted=self.eas_sampling == "degree", bandwidth_intra=self.link_model.bandwidth("intra"),
                           bandwidth_inter=self.link_model.bandwidth("inter"), seed=self.seed, cache_dir=self.cache_dir)

    def _train_mode(self, data) -> str:
        """The mode to train in, from the graph layer's planner (``auto``'s choice said)."""
        module, device = self.lightning_module, self.root_device
        plan = plan_training(data, self._plan_request(self.mode, data.num_features),
                             lambda: measure_compute(module, data, device))
        self.choice = plan.choice
        if plan.choice is not None:
            rank_zero_info(f"granndis: {plan.reason}")
        return plan.mode

    def _budget(self) -> int:
        if self.memory_budget_mb is not None:
            return int(self.memory_budget_mb * 2**20)
        return available_memory(self.root_device, self.num_processes)

    def _check_memory(self, shard: RankShard, process: int) -> None:
        """Every rank estimates what training its shard will hold; if any will not fit, every
        rank refuses, naming the worst one, before a step."""
        mode = self.resolved_mode or "full"
        widths = model_widths(self.lightning_module, int(shard.eval.x.shape[1]), self.num_layers)
        trainer = self.lightning_module.trainer
        evaluates = trainer.limit_val_batches != 0 and is_overridden("validation_step", self.lightning_module)
        estimate = estimate_rank_memory(shard, mode, widths, self.fanouts, self.batching,
                                        self.topology.devices_per_server, self.sampler_depth, process,
                                        on_host=self.root_device.type == "cpu", evaluates=evaluates, seed=self.seed,
                                        world=self.world_size, keep_inner=self.cob_sampling == "eas")
        gathered = comm.gather_objects((estimate, self._budget()))
        # one budget (the tightest rank's) and one decision (the worst rank's): all ranks train alike
        estimates, budget = [e for e, _ in gathered], min(b for _, b in gathered)
        worst = max(estimates, key=lambda e: e.total)
        self.layers_trimmed = self._masking.set_trim(trim_needed(worst, budget, self.trim_layers))
        if self.layers_trimmed:
            estimate, estimates = estimate.trimmed(), [e.trimmed() for e in estimates]
            worst = max(estimates, key=lambda e: e.total)
            rank_zero_info(f"{self.strategy_name}: layers trimmed (trim_layers): layer k of {self.num_layers} computes "
                           f"only the rows within {self.num_layers} - 1 - k hops of the seeds")
        # batch after batch, each of another size: let freed ones go (where the C library can)
        self.host_memory_released = release_needed(worst, budget, self.release_host_memory) and release_freed_memory()
        if self.host_memory_released:
            estimate, estimates = estimate.released(), [e.released() for e in estimates]
            rank_zero_info(f"{self.strategy_name}: freed batch memory goes back to the system "
                           "(release_host_memory; slower steps, memory that follows the batch)")
        self.memory_estimate = estimate
        refuse_unless_fits(estimates, budget, mode, self.strategy_name)
        rank_zero_info(f"{self.strategy_name}: memory estimate {estimate.describe()}; budget "
                       f"{budget / 2**20:,.0f} MB per rank")

    # ------------------------------------------------------------------ halo exchange
    def _server_group(self):
        """This rank's intra-server process group."""
        return comm.server_groups(self.topology).intra_of(self.topology, self.global_rank)

    def _exchange(self, rows: torch.Tensor, graph: OneHopGraph) -> torch.Tensor:
        scope, purpose = graph.meta.get("scope", "intra"), graph.meta.get("purpose", "halo")
        if scope == "none":
            return rows[:0]
        group = None if scope == "world" else self._server_group()
        if self.halo_bits is not None and purpose == "halo":
            return quantised_exchange(self.comm, rows, graph.send_splits, graph.recv_splits, self.halo_bits,
                                      purpose, group)
        return self.comm.exchange(rows, graph.send_splits, purpose, group, recv_splits=graph.recv_splits)

    # ------------------------------------------------------------------ steps
    @override
    def batch_to_device(self, batch: Any, device: torch.device | None = None, dataloader_idx: int = 0) -> Any:
        if getattr(batch, "granndis_key", None) is not None and getattr(batch, "x", None) is None:
            batch = materialise(batch, self._parts[int(batch.granndis_key)])
        return super().batch_to_device(batch, device, dataloader_idx)

    def _activate(self, batch) -> None:
        self._masking.activate(self._graphs[int(batch.granndis_key)])

    @override
    def training_step(self, *args: Any, **kwargs: Any):
        batch = args[0]
        if self._sampled is not None:  # the batches before this one are trained: free them
            self._sampled.trained(int(batch.granndis_key))
        self._activate(batch)
        weight = self._parts[int(batch.granndis_key)].weight
        with seed_weighted_logging(self.lightning_module, weight, self.world_size):
            out = super().training_step(*args, **kwargs)
        if isinstance(out, torch.Tensor):
            return _reweight(out, weight)
        if isinstance(out, dict) and isinstance(out.get("loss"), torch.Tensor):
            return {**out, "loss": _reweight(out["loss"], weight)}
        return out

    def _evaluate(self, split: str, args, kwargs, step):
        batch = args[0]
        self._activate(batch)
        if not self.exact_eval:
            return step(*args, **kwargs)
        module = self.lightning_module
        with self.precision_plugin.val_step_context():
            logits = module(batch.x, batch.edge_index)
        mask = getattr(batch, f"{split}_mask", None)
        if mask is None:
            raise ValueError(f"the graph has no {split}_mask: exact evaluation needs the split's vertices.")
        mask = mask.to(logits.device)
        correct = int((logits[mask].argmax(-1) == batch.y.to(logits.device)[mask]).sum())
        # accuracy counted over each rank's own vertices and summed: what OGB's Evaluator computes
        # for accuracy, without gathering the whole graph's predictions or labels anywhere
        counts = torch.tensor(comm.gather_objects((correct, int(mask.sum())))).sum(0)
        acc = float(counts[0]) / max(1, int(counts[1]))
        self.last_eval[split] = acc
        # the same value on every rank: the (mean) sync only silences Lightning's warning
        module.log(f"{split}_acc", acc, batch_size=1, prog_bar=True, sync_dist=True)
        return None

    @override
    def validation_step(self, *args: Any, **kwargs: Any):
        return self._evaluate("val", args, kwargs, super().validation_step)

    @override
    def test_step(self, *args: Any, **kwargs: Any):
        return self._evaluate("test", args, kwargs, super().test_step)

    @property
    @override
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        # every rank reads the whole-graph loader (one item) and keeps its own part of it
        return {"num_replicas": 1, "rank": 0}

    @override
    def predict_step(self, *args: Any, **kwargs: Any):
        """Predictions for every vertex, in vertex order, the same on every rank: the module's
        ``predict_step`` (or, when it has none, ``module(batch.x, batch.edge_index)``) on the
        rank's part of the exact full-graph split, whose rows are ``batch.n_id``, gathered by id."""
        batch = args[0]
        self._activate(batch)
        module = self.lightning_module
        with self.precision_plugin.predict_step_context():
            if is_overridden("predict_step", module):
                out = super().predict_step(*args, **kwargs)
            else:
                out = module(batch.x, batch.edge_index)
        rows = batch.n_id
        if not isinstance(out, torch.Tensor) or out.dim() == 0 or out.shape[0] != rows.numel():
            shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise ValueError(
                f"predict_step returned {shape} on rank {self.global_rank}; under {self.strategy_name} it must "
                f"return one tensor with a row per vertex of the batch ({rows.numel()} rows, ids batch.n_id), "
                "which the strategy gathers into every vertex's prediction in vertex order."
            )
        parts = comm.gather_objects((rows.cpu(), out.detach().cpu()))
        total = sum(int(r.numel()) for r, _ in parts)
        full = torch.empty((total, *out.shape[1:]), dtype=out.dtype)
        seen = torch.zeros(total, dtype=torch.bool)
        for r, o in parts:
            full[r], seen[r] = o, True
        assert bool(seen.all()), "the exact split owns every vertex once"
        return full.to(out.device)

    @classmethod
    @override
    def register_strategies(cls, strategy_registry) -> None:
        strategy_registry.register(cls.strategy_name, cls, description="GraNNDis (mode chosen by its cost model)",
                                   override=True)
        for mode in ("flx", "cob", "eas"):
            strategy_registry.register(f"granndis_{mode}", cls, description=f"GraNNDis, mode={mode}", mode=mode,
                                       override=True)


def _reweight(loss: torch.Tensor, weight: float) -> torch.Tensor:
    if weight == 0.0:  # no seed on this rank: its (NaN) mean over nothing must not count
        return torch.nan_to_num(loss, nan=0.0) * 0.0
    return loss * weight
