"""DDP that knows which ranks share a server, books its traffic, and syncs gradients hierarchically."""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.cloud_io import _is_local_file_protocol
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.strategies import DDPStrategy
from typing_extensions import override

from lightning_granndis import checkpoint_sets, comm, random_state
from lightning_granndis.link_model import LinkModel
from lightning_granndis.strategies.checkpoint_io import SafeCheckpointIO
from lightning_granndis.strategies.loop_state import settle_epoch_end
from lightning_granndis.strategies.resumable_loader import ResumableDataLoader, resumable
from lightning_granndis.topology import ServerTopology

log = logging.getLogger(__name__)


class ServerAwareDDPStrategy(DDPStrategy):
    """Lightning's DDP plus a :class:`ServerTopology`, a booked :class:`~lightning_granndis.comm.
    Communicator`, and hierarchical gradient synchronisation.

    GraNNDis (PACT'24, §5) keeps every inter-server transfer off the critical path except the
    gradient sync. This strategy makes that sync cheap across servers:

    .. math::
        g = \\frac{1}{P}\\sum_{s=1}^{N}\\Big(\\sum_{d=1}^{G} g_{s,d}\\Big)

    computed as reduce inside each server (to its head), all-reduce among the ``N`` heads, and
    broadcast inside each server. Only the heads cross servers, so inter-server gradient bytes
    fall by the number of devices per server ``G``. The result equals plain DDP's all-reduce
    (up to floating-point summation order).

    Args:
        servers: number of servers. Default: one per node (``num_nodes``). On one machine,
            ``servers=S`` splits the ranks into ``S`` virtual servers.
        link_model: a :class:`LinkModel` or a preset name (``granndis_paper``, ``10gbe``, ``1gbe``)
            for modelled time and emulation. Default ``granndis_paper``.
        emulate: delay inter-server operations to their modelled duration (default ``False``).
        hierarchical: hierarchical gradient sync (default ``True``); ``False`` gives a flat, booked
            all-reduce, i.e. plain DDP with a ledger.
        checkpoint_checksum: record (and check when loading) each checkpoint file's SHA-256 in
            its set's commit record (default ``True``; sizes are always recorded and checked).
        **kwargs: passed on to :class:`~lightning.pytorch.strategies.DDPStrategy`.
    """

    strategy_name = "server_aware_ddp"

    def __init__(
        self,
        servers: int | None = None,
        link_model: LinkModel | str | dict | None = "granndis_paper",
        emulate: bool = False,
        hierarchical: bool = True,
        checkpoint_checksum: bool = True,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("checkpoint_io", SafeCheckpointIO())
        super().__init__(**kwargs)
        self.checkpoint_checksum = checkpoint_checksum
        self._servers = servers
        self._link_model = LinkModel.resolve(link_model)
        self.emulate = emulate
        self.hierarchical = hierarchical
        self.topology: ServerTopology | None = None
        self.comm: comm.Communicator | None = None
        self._failure_watch: comm.FailureWatch | None = None
        self._eval_loaders: list = []  # fit's validation loaders with persistent workers (see resumable_loader)

    @property
    def link_model(self) -> LinkModel:
        return self._link_model

    # ------------------------------------------------------------------ topology
    def build_topology(self) -> ServerTopology:
        """The topology of this run, checked against the world size (no process group needed)."""
        world = self.num_nodes * self.num_processes
        return ServerTopology(world_size=world, servers=self._servers or self.num_nodes, nodes=self.num_nodes)

    @override
    def teardown(self) -> None:
        if self._failure_watch is not None:
            self._failure_watch.stop()
            self._failure_watch = None
        super().teardown()

    @override
    def on_train_start(self) -> None:
        super().on_train_start()
        comm.ignore_sigterm_while_failing()  # the trainer's handlers are registered by now

    @override
    def on_validation_start(self) -> None:
        super().on_validation_start()
        comm.ignore_sigterm_while_failing()

    @override
    def on_test_start(self) -> None:
        super().on_test_start()
        comm.ignore_sigterm_while_failing()

    @override
    def on_predict_start(self) -> None:
        super().on_predict_start()
        comm.ignore_sigterm_while_failing()

    @override
    def on_exception(self, exception: BaseException) -> None:
        super().on_exception(exception)
        # every rank's error names the rank that failed first, not only gloo's "Connection closed"
        comm.explain_failure(exception)

    @override
    def _configure_launcher(self) -> None:
        # Validate before any process is launched, so a bad world size fails at Trainer(...).
        self.build_topology()
        super()._configure_launcher()

    @override
    def setup_distributed(self) -> None:
        # under torchrun, each restart attempt keeps its rendezvous keys apart (see comm)
        self.set_world_ranks()
        if self.cluster_environment is not None and self.cluster_environment.creates_processes_externally:
            from datetime import timedelta

            os.environ.setdefault("MASTER_ADDR", self.cluster_environment.main_address)
            os.environ.setdefault("MASTER_PORT", str(self.cluster_environment.main_port))
            device = self.root_device if self.root_device.type != "cpu" else None
            comm.init_restart_safe(self._get_process_group_backend(), self.global_rank, self.world_size,
                                   self._timeout or timedelta(minutes=30), device)
        super().setup_distributed()

    @override
    def setup_environment(self) -> None:
        if self.root_device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
            # Several processes share the cores: one intra-op pool each, or they thrash (3-7x slower).
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, self.num_processes)))
        super().setup_environment()
        self._eval_loaders = []  # this run's (a trainer per fit, or several fits of one)
        self.topology = self.build_topology()
        comm.server_groups(self.topology)
        if self._link_model.reference is not None:
            self._link_model = self._link_model.resolve_reference(self._rank_speed(self._link_model.reference_by))
        self.comm = comm.Communicator(self.topology, self._link_model, emulate=self.emulate)
        if self._failure_watch is None:  # a rank waiting on a failed peer stops, saying why
            comm.new_failure_generation()  # an earlier run's caught failure is not this run's
            self._failure_watch = comm.FailureWatch().start()

    def setup_without_ddp(self, trainer, prepare_model) -> None:
        """Lightning's set-up minus the DDP wrapper, for strategies that move gradients themselves
        (pipelines, blockwise distillation): the module goes to the device, ``prepare_model()``
        splits or plans it, then the optimizers are built over what this rank keeps."""
        from lightning.fabric.utilities.optimizer import _optimizers_to_device
        from lightning.pytorch.trainer.states import TrainerFn

        assert self.accelerator is not None and self.model is not None
        self.accelerator.setup(trainer)
        self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        prepare_model()
        fitting = trainer.state.fn == TrainerFn.FITTING
        if fitting:
            self.setup_optimizers(trainer)
        self.setup_precision_plugin()
        if fitting:
            _optimizers_to_device(self.optimizers, self.root_device)

    def _rank_speed(self, by: str) -> float:
        """FLOP/s (``by="flops"``) or memory B/s (``"memory"``) one rank gets: measured one rank at
        a time (ranks share cores), times its share of the cores when all ranks work at once; the
        mean over ranks, so every rank agrees."""
        from lightning_granndis.link_model import measure_local_flops, measure_local_memory_bandwidth

        measure = measure_local_flops if by == "flops" else measure_local_memory_bandwidth
        speeds = []
        for r in range(self.world_size):
            if r == self.global_rank:
                speeds.append(measure())
            comm.barrier()
        mine = speeds[0]
        if self.root_device.type == "cpu":
            cores = os.cpu_count() or 1
            mine *= min(1.0, cores / max(1, self.num_processes * torch.get_num_threads()))
        values = comm.gather_objects(mine)
        return sum(values) / len(values)

    # ------------------------------------------------------------------ checkpoints as committed sets
    def checkpoint_files(self, filepath: _PATH) -> list[Path]:
        """The files one checkpoint consists of (a pipeline adds its other stages' shards)."""
        return [Path(filepath)]

    @contextmanager
    def writing_on_every_server(self):
        """Inside it, every server's head writes (and commits, and removes) each checkpoint, in a
        folder of its own server, instead of rank 0 alone: the replica snapshots of
        :class:`~lightning_granndis.callbacks.ReplicaSnapshot`, kept in each server's own memory."""
        self._every_server_writes = True
        try:
            yield
        finally:
            self._every_server_writes = False

    @property
    def writes_checkpoint_files(self) -> bool:
        """Whether this rank writes the checkpoint being saved: rank 0, or each server's head
        inside :meth:`writing_on_every_server`."""
        if getattr(self, "_every_server_writes", False) and self.topology is not None:
            return self.topology.is_head(self.global_rank)
        return self.is_global_zero

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: _PATH, storage_options: Any | None = None) -> None:
        # every rank's generators (dropout masks, sampling) and evaluation loaders' workers: a resumed
        # run draws what this one would
        checkpoint["rank_random_states"] = comm.gather_objects(self.rank_resume_state())
        if self.writes_checkpoint_files:
            self.checkpoint_io.save_checkpoint(checkpoint, filepath, storage_options=storage_options)
        self.commit_checkpoint(checkpoint, filepath)

    def commit_checkpoint(self, checkpoint: dict[str, Any], filepath: _PATH) -> None:
        """Once every rank has written its files (a barrier), rank 0 commits them as one set
        (:mod:`~lightning_granndis.checkpoint_sets`): a set cut short by a crash is never loaded."""
        if not _is_local_file_protocol(filepath):
            return
        comm.barrier()  # a no-op without a process group
        if self.writes_checkpoint_files:
            checkpoint_sets.commit_set(filepath, self.checkpoint_files(filepath), checkpoint.get("global_step", 0),
                                       checkpoint.get("epoch", 0), checksum=self.checkpoint_checksum)

    @override
    def remove_checkpoint(self, filepath: _PATH) -> None:
        if self.writes_checkpoint_files:
            if _is_local_file_protocol(filepath):
                checkpoint_sets.uncommit(filepath)  # the record goes first: a half-deleted set is not complete
            self.checkpoint_io.remove_checkpoint(filepath)

    @override
    def load_checkpoint(self, checkpoint_path: _PATH, weights_only: bool | None = None) -> dict[str, Any]:
        checkpoint_path = self.agree_on_checkpoint(checkpoint_path)
        self.verify_checkpoint(checkpoint_path)
        checkpoint = super().load_checkpoint(checkpoint_path, weights_only=weights_only)
        settle_epoch_end(checkpoint)  # Lightning 2.6 miscounts a resumed epoch end (see loop_state)
        states = checkpoint.get("rank_random_states")
        if states and len(states) == self.world_size:  # another world size: each rank keeps its own seed
            self.resume_rank_state(states[self.global_rank])
        return checkpoint

    def rank_resume_state(self) -> dict:
        """What this rank resumes beside the checkpoint's shared state: its generators, and the
        state of its evaluation loaders that keep worker processes (their seed and generators
        carry over from one validation to the next)."""
        return {"generators": random_state.capture(self.root_device),
                "eval_loaders": [loader.started_state() for loader in self._eval_loaders]}

    def resume_rank_state(self, state: dict) -> None:
        """Holds ``state`` (from :meth:`rank_resume_state`) until the loaders are made."""
        self._resumed_random_state = state.get("generators", state)  # (older checkpoints: generators alone)
        self._resumed_eval_states = list(state.get("eval_loaders", []))

    @override
    def process_dataloader(self, dataloader: object) -> object:
        dataloader = self.resumable_loader(super().process_dataloader(dataloader))
        self.restore_resumed_random_state()
        return dataloader

    def resumable_loader(self, dataloader: object) -> object:
        """``fit``'s loaders as checkpointed loaders: the training loader (its position resumes
        mid-epoch exactly; the sampler knows the epoch before the resumed iterator reads it) and a
        validation loader with persistent workers (its workers' seed and generators carry over
        from one validation to the next, so they go into each checkpoint and come back)."""
        from lightning.pytorch.trainer.states import TrainerFn

        trainer = self.lightning_module.trainer
        if trainer.training:
            return resumable(dataloader, epoch=trainer.fit_loop.epoch_progress.current.processed)
        keeps_workers = getattr(dataloader, "persistent_workers", False) and getattr(dataloader, "num_workers", 0)
        if trainer.state.fn != TrainerFn.FITTING or not keeps_workers:
            return dataloader
        loader = resumable(dataloader)
        if isinstance(loader, ResumableDataLoader):
            pending = getattr(self, "_resumed_eval_states", None) or []
            index = len(self._eval_loaders)
            if index < len(pending) and pending[index] is not None:
                loader.load_state_between_epochs(pending[index])
            self._eval_loaders.append(loader)
        return loader

    def restore_resumed_random_state(self) -> None:
        """Puts back this rank's generators from the checkpoint being resumed, once the training
        loader is ready and before Lightning makes its iterator (which draws a seed): the point
        where the uninterrupted run stood when it saved. Set-up after loading (plans, partitions)
        may draw random numbers the uninterrupted run drew before its checkpoint."""
        state = getattr(self, "_resumed_random_state", None)
        module = self.lightning_module
        if state is not None and module is not None and module.trainer is not None and module.trainer.training:
            random_state.restore(state, self.root_device)
            self._resumed_random_state = None

    def agree_on_checkpoint(self, checkpoint_path: _PATH) -> _PATH:
        """The checkpoint every rank resumes from: the newest step any rank found (a collective).

        Ranks choose their checkpoint on their own (``ckpt_path="last"``), and a server that lost
        its memory finds an older checkpoint on disk than its peers' replica snapshots. Such a
        server receives the newest snapshot from the lowest rank holding it (each rank of it gets
        the set; its head writes it into the server's own snapshot folder) and resumes from it,
        as every other rank does. Where every rank chose the same step, nothing moves."""
        if not comm.is_initialized() or not _is_local_file_protocol(checkpoint_path):
            return checkpoint_path
        try:
            mine = checkpoint_sets.read_set(checkpoint_path)[0].step
        except checkpoint_sets.CheckpointSetError:
            mine = -1  # not a committed set (plain Lightning's): the path every rank was given
        steps = comm.gather_objects(mine)
        best = max(steps)
        if min(steps) == best:
            return checkpoint_path
        source = steps.index(best)
        blobs = comm.broadcast_object(checkpoint_sets.pack_set(checkpoint_path, self.checkpoint_checksum)
                                      if self.global_rank == source else None, src=source)
        folder = getattr(self, "replica_folder", None)
        if folder is None:  # the same answer on every rank: all of them raise
            raise RuntimeError(f"the ranks found checkpoints of different steps {steps} and no ReplicaSnapshot "
                               "folder to receive the newest into: resume every rank from the same checkpoint "
                               "(ckpt_path=...).")
        target = checkpoint_path
        if mine != best:
            record = next(name for name in blobs if name.endswith(checkpoint_sets.SUFFIX))
            target = Path(folder) / record[: -len(checkpoint_sets.SUFFIX)]
            if self.topology is not None and self.topology.is_head(self.global_rank):
                checkpoint_sets.unpack_set(folder, blobs)
                log.warning(f"lightning_granndis: server {self.topology.server_of(self.global_rank)} had a checkpoint "
                            f"of step {mine} only; it resumes from rank {source}'s replica snapshot of step {best}.")
        comm.barrier()  # every server's head has written it
        placeholder = Path(checkpoint_path).name == checkpoint_sets.RECEIVED_PLACEHOLDER
        if placeholder and self.topology is not None and self.topology.is_head(self.global_rank):
            Path(checkpoint_path).unlink(missing_ok=True)  # it stood for the set just received
        trainer = self.lightning_module.trainer if self.lightning_module is not None else None
        if trainer is not None and mine != best:  # trainer.ckpt_path says what was resumed
            trainer._checkpoint_connector._ckpt_path = target
        return target

    def verify_checkpoint(self, checkpoint_path: _PATH) -> None:
        """Refuses a committed set whose files are missing, truncated, corrupt or mixed, naming the
        file. A checkpoint without a commit record (plain Lightning's) loads as before."""
        if _is_local_file_protocol(checkpoint_path) and checkpoint_sets.manifest_path(checkpoint_path).exists():
            checkpoint_sets.verify_set(checkpoint_path, checksum=self.checkpoint_checksum)

    # ------------------------------------------------------------------ gradient sync
    @override
    def _register_ddp_hooks(self) -> None:
        if self._ddp_comm_hook is not None:
            return super()._register_ddp_hooks()
        # Unlike Lightning's, ours runs on every backend: gloo supports completed-future hooks.
        self.model.register_comm_hook(state=None, hook=self._grad_sync_hook)

    def _grad_sync_hook(self, state, bucket):  # DDP rejects any annotation but the real GradBucket
        buffer = bucket.buffer()
        self.sync_gradients(buffer)
        future: torch.futures.Future = torch.futures.Future()
        future.set_result(buffer)
        return future

    def sync_gradients(self, buffer: torch.Tensor) -> torch.Tensor:
        """Averages ``buffer`` over all ranks in place, hierarchically when enabled."""
        assert self.topology is not None and self.comm is not None
        buffer.div_(self.topology.world_size)
        topo = self.topology
        if not self.hierarchical or topo.servers == 1 or topo.devices_per_server == 1:
            self.comm.all_reduce(buffer, "grad_sync")
            return buffer
        groups = comm.server_groups(topo)
        rank = self.global_rank
        head = topo.head_of(topo.server_of(rank))
        intra = groups.intra_of(topo, rank)
        self.comm.reduce(buffer, dst=head, purpose="grad_sync", group=intra)
        if rank == head:
            self.comm.all_reduce(buffer, "grad_sync", group=groups.heads)
        self.comm.broadcast(buffer, src=head, purpose="grad_sync", group=intra)
        return buffer

    @classmethod
    @override
    def register_strategies(cls, strategy_registry) -> None:
        strategy_registry.register(
            cls.strategy_name,
            cls,
            description="DDP with server topology, communication ledger and hierarchical gradient sync",
            override=True,
        )
