"""Pipeline parallelism inside Lightning, with Optimus-CC's communication compression."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

import lightning.pytorch as pl
import torch
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.utilities import rank_zero_info
from torch import nn
from typing_extensions import override

from lightning_granndis import checkpoint_sets, comm
from lightning_granndis.compression.powersgd import PowerSGDReducer, all_reduce_flat
from lightning_granndis.link_model import LinkModel
from lightning_granndis.pipeline.checkpoint import resumed_balance, shard_path
from lightning_granndis.pipeline.layout import PipelineLayout, build_layout
from lightning_granndis.pipeline.runtime import BackwardCompression, PipelineRuntime
from lightning_granndis.pipeline.schedules import SCHEDULES
from lightning_granndis.strategies.loop_state import settle_epoch_end
from lightning_granndis.strategies.server_aware_ddp import ServerAwareDDPStrategy


class CompressedPipelineStrategy(ServerAwareDDPStrategy):
    """DP x PP pipeline training of a :class:`~lightning_granndis.pipeline.PipelinedModule`, with
    Optimus-CC's compression (Song et al., `Optimus-CC: Efficient Large NLP Model Training with 3D
    Parallelism Aware Communication Compression <https://arxiv.org/abs/2301.09830>`_, ASPLOS'23).

    The world of ``P`` ranks runs ``P / stages`` replicas of a ``stages``-deep pipeline; replica
    ``d`` holds ranks ``d*stages .. d*stages + stages - 1``. Each rank keeps only its stage's blocks
    (and their optimizer state). A step runs the batch's micro-batches through the schedule, then
    averages each stage's gradients over the replicas, then steps every rank's optimizer.

    Args:
        stages: pipeline depth (default: the whole world, one replica).
        schedule: ``"1f1b"`` (default) or ``"gpipe"``.
        microbatches: micro-batches per batch (default 4).
        balance: blocks per stage; default: a bottleneck-minimising split of the blocks' profiled
            cost (``example_input_array``) or, without one, their parameter counts.
        memory_cap: bytes one stage may hold when planning (default unlimited).
        compress_backward: Compressed Backpropagation (CB) of the activation gradients.
        rank: rank of CB's factors (default 16).
        lep: Lazy Error Propagation for CB (default ``True``).
        epilogue_only: compress only the schedule's flush (cool-down) sends (default ``False``).
        inter_server_only: compress only boundaries that cross servers (default ``False``).
        fused_embedding: Fused Embedding synchronisation (FE): a parameter shared by several stages
            (tied embeddings) is averaged over replicas and summed over its stages in one
            collective, instead of a data-parallel all-reduce then an embedding all-reduce.
        dp_compression: PowerSGD for the data-parallel gradient averaging.
        dp_rank: its rank (default 4).
        selective_stages: Selective Compression (SC): only stages ``< selective_stages`` (the first
            ``W``, whose gradients are ready last) use PowerSGD; default all stages.
        dp_warmup_steps: exact averaging for this many first steps (default 0).
        servers, link_model, emulate: as in :class:`ServerAwareDDPStrategy`.
        **kwargs: passed on to Lightning's ``DDPStrategy`` (launch, process group, timeouts).

    Traffic is booked as ``activation``, ``activation_grad``, ``grad_sync`` and ``embedding_sync``.

    Randomness: once the model is split, every rank's torch generator is re-seeded from the run's
    seed, its stage and its replica (:func:`stage_seed`), so stages and replicas draw independent
    dropout masks, reproducibly; each rank's generator state is saved in the checkpoint, so resume
    stays exact.
    """

    strategy_name = "compressed_pipeline"

    def __init__(
        self,
        stages: int | None = None,
        schedule: str = "1f1b",
        microbatches: int = 4,
        balance: Sequence[int] | None = None,
        memory_cap: float | None = None,
        compress_backward: bool = False,
        rank: int = 16,
        lep: bool = True,
        epilogue_only: bool = False,
        inter_server_only: bool = False,
        fused_embedding: bool = False,
        dp_compression: bool = False,
        dp_rank: int = 4,
        selective_stages: int | None = None,
        dp_warmup_steps: int = 0,
        servers: int | None = None,
        link_model: LinkModel | str | dict | None = "optimus_cc_paper",
        emulate: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(servers=servers, link_model=link_model, emulate=emulate, hierarchical=False, **kwargs)
        if schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}.")
        if microbatches < 1:
            raise ValueError(f"microbatches must be at least 1, got {microbatches}.")
        if rank < 1 or dp_rank < 1:
            raise ValueError(f"compression ranks must be at least 1, got rank={rank}, dp_rank={dp_rank}.")
        if stages is not None and stages < 1:
            raise ValueError(f"stages must be at least 1, got {stages}.")
        self._stages = stages
        self.schedule, self.microbatches = schedule, microbatches
        self.balance = list(balance) if balance is not None else None
        self.memory_cap = memory_cap
        self.compress_backward, self.rank, self.lep = compress_backward, rank, lep
        self.epilogue_only, self.inter_server_only = epilogue_only, inter_server_only
        self.fused_embedding = fused_embedding
        self.dp_compression, self.dp_rank = dp_compression, dp_rank
        self.selective_stages, self.dp_warmup_steps = selective_stages, dp_warmup_steps
        self.layout: PipelineLayout | None = None
        self.runtime: PipelineRuntime | None = None
        self.reducer: PowerSGDReducer | None = None

    # ------------------------------------------------------------------ shape of the run
    @property
    def stages(self) -> int:
        return self._stages or self.num_nodes * self.num_processes

    @property
    def replicas(self) -> int:
        return (self.num_nodes * self.num_processes) // self.stages

    @override
    def _configure_launcher(self) -> None:
        world = self.num_nodes * self.num_processes
        if world % self.stages:
            raise ValueError(
                f"world size {world} (devices x num_nodes) is not a multiple of stages={self.stages}: use a world of "
                f"replicas x stages ranks, or stages in {[s for s in range(1, world + 1) if world % s == 0]}."
            )
        super()._configure_launcher()

    @property
    @override
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        # Every stage of a replica reads the same batches; replicas read disjoint ones.
        replica = self.global_rank // self.stages
        return {"num_replicas": self.replicas, "rank": replica}

    # ------------------------------------------------------------------ set-up
    @override
    def setup(self, trainer: pl.Trainer) -> None:
        self.setup_without_ddp(trainer, self._setup_pipeline)
        self.precision_plugin.clip_grad_by_norm = self._clip_grad_by_norm  # global norm across stages

    def _setup_pipeline(self, resumed_from: _PATH | None = None) -> None:
        module = self.lightning_module
        for hook in ("pipeline_blocks", "pipeline_input", "pipeline_loss", "pipeline_step"):
            if not callable(getattr(module, hook, None)):
                raise TypeError(
                    f"{type(module).__name__} cannot be pipelined: it has no {hook}(). Derive it from "
                    "lightning_granndis.pipeline.PipelinedModule and declare its blocks and loss."
                )
        if self.layout is not None and getattr(module, "_pipeline_layout", None) is self.layout:
            return  # already split (e.g. validate after fit)
        assert self.topology is not None and self.comm is not None
        balance = self.balance
        if balance is None and resumed_from is not None:
            # A profiled split depends on timings; a resumed run keeps the split its checkpoint has.
            balance = resumed_balance(resumed_from, self.stages) if self.global_rank == 0 else None
        self.layout = build_layout(module, self.topology, self.stages, balance=balance,
                                   memory_cap=self.memory_cap, microbatches=self.microbatches,
                                   device=self.root_device)
        layout = self.layout
        # every rank built the same model from the same seed; from here on its own stream
        torch.manual_seed(stage_seed(torch.initial_seed(), layout.stage, layout.replica))
        if self.global_rank == 0:
            rank_zero_info(layout.describe())
        compression = None
        if self.compress_backward:
            boundaries = set(range(self.stages - 1))
            if self.inter_server_only:
                boundaries = set(layout.placement.inter_boundaries[layout.replica])
            compression = BackwardCompression(self.rank, self.lep, self.epilogue_only, frozenset(boundaries))
        self.runtime = PipelineRuntime(
            layout.stage, layout.chain, layout.owned_blocks(), self.comm, self.schedule, self.microbatches,
            compression, chain_group=layout.chain_group, device=self.root_device,
        )
        compressed = self.dp_compression and (self.selective_stages is None or layout.stage < self.selective_stages)
        self.reducer = PowerSGDReducer(self.dp_rank, warmup_steps=self.dp_warmup_steps) if compressed else None
        module._pipeline_runner = self.runtime
        module._pipeline_layout = layout
        # A stage cannot run the whole forward: keep Lightning's model summary from trying.
        module.example_input_array = None

    # ------------------------------------------------------------------ step
    @override
    def backward(self, closure_loss: torch.Tensor, optimizer, *args: Any, **kwargs: Any) -> torch.Tensor:
        # The pipeline already ran the backward inside the step; here its gradients join `.grad`,
        # after Lightning's zero_grad, scaled like the loss Lightning would have back-propagated.
        module = self.lightning_module
        self.pre_backward(closure_loss)
        closure_loss = self.precision_plugin.pre_backward(closure_loss, module)
        accumulate = self.lightning_module.trainer.accumulate_grad_batches if module.automatic_optimization else 1
        assert self.runtime is not None
        self.runtime.apply_grads(1.0 / accumulate)
        closure_loss = self.precision_plugin.post_backward(closure_loss, module)
        self.post_backward(closure_loss)
        return closure_loss

    @override
    def optimizer_step(self, optimizer, closure: Callable[[], Any], model=None, **kwargs: Any) -> Any:
        def closure_then_sync() -> Any:
            out = closure()
            self.sync_pipeline_gradients()
            return out

        return super().optimizer_step(optimizer, closure_then_sync, model, **kwargs)

    def sync_pipeline_gradients(self) -> None:
        """Averages this stage's gradients over the replicas and sums shared (tied) parameters'
        over the stages holding them: FE fuses the two into one collective."""
        assert self.layout is not None and self.runtime is not None and self.comm is not None
        layout = self.layout
        params = self.runtime.params
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        shared = [p for p in params if id(p) in layout.shared]
        plain = [p for p in params if id(p) not in layout.shared]
        fuse = self.fused_embedding and shared
        dp_params = plain if fuse else params
        if self.replicas > 1 and dp_params:
            grads = [p.grad for p in dp_params]
            if self.reducer is not None:
                self.reducer.reduce(grads, self.comm, layout.dp_group, self.replicas)
            else:
                all_reduce_flat(grads, self.comm, layout.dp_group, self.replicas, "grad_sync")
        if shared:
            grads = [p.grad for p in shared]
            if fuse:  # one collective over every holder of every replica: sum / replicas
                all_reduce_flat(grads, self.comm, layout.shared_group_all, self.replicas, "embedding_sync")
            else:     # already averaged over replicas: sum over this replica's holders
                all_reduce_flat(grads, self.comm, layout.shared_group_replica, 1, "embedding_sync")

    def _clip_grad_by_norm(self, optimizer, clip_val: float | int) -> None:
        """Clips by the norm of the whole model's gradient (every stage, shared parameters once)."""
        assert self.layout is not None and self.runtime is not None and self.comm is not None
        grads = [p.grad for p in self.runtime.params if p.grad is not None and self.layout.counts_in_norm(p)]
        total = torch.zeros((), device=self.root_device)
        for g in grads:
            total += g.detach().float().pow(2).sum()
        if self.stages > 1:
            self.comm.all_reduce(total, "other", group=self.layout.chain_group)
        norm = total.sqrt()
        scale = torch.clamp(float(clip_val) / (norm + 1e-6), max=1.0)
        for p in self.runtime.params:
            if p.grad is not None:
                p.grad.mul_(scale.to(p.grad.dtype))

    # ------------------------------------------------------------------ checkpoints
    def shard_path(self, filepath: _PATH, stage: int | None = None) -> Path:
        """Stage 0's shard is ``filepath`` itself (with the loops' state); stage ``s`` writes
        ``filepath.stage{s}``."""
        stage = self.layout.stage if stage is None and self.layout is not None else (stage or 0)
        return shard_path(filepath, stage)

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: _PATH, storage_options: Any | None = None) -> None:
        assert self.layout is not None
        # Residuals (LEP, PowerSGD) and generators differ per replica: stage s's shard keeps every replica's.
        states = comm.gather_objects(_move(self._rank_state(), "cpu"), group=self.layout.dp_group) \
            if self.replicas > 1 else [self._rank_state()]
        if self.layout.replica == 0:
            checkpoint["pipeline"] = self.layout.metadata()
            checkpoint["pipeline_state"] = {"replicas": states}
            self.checkpoint_io.save_checkpoint(checkpoint, self.shard_path(filepath), storage_options=storage_options)
        self.commit_checkpoint(checkpoint, filepath)  # every stage's shard, committed as one set

    @override
    def checkpoint_files(self, filepath: _PATH) -> list[Path]:
        return [self.shard_path(filepath, stage) for stage in range(self.stages)]

    @override
    def load_checkpoint(self, checkpoint_path: _PATH, weights_only: bool | None = None) -> dict[str, Any]:
        if self.layout is None:  # Lightning restores the module before `setup`: split it now
            self._setup_pipeline(resumed_from=checkpoint_path)
        assert self.layout is not None
        self.verify_checkpoint(checkpoint_path)  # a committed set: every shard present, of one step
        path = self.shard_path(checkpoint_path)
        if not path.exists():
            raise FileNotFoundError(
                f"{path}: missing shard of stage {self.layout.stage} for checkpoint {checkpoint_path}; a "
                f"{self.stages}-stage pipeline checkpoint has one file per stage (see shard_path)."
            )
        checkpoint = self.checkpoint_io.load_checkpoint(path, weights_only=True if weights_only is None else weights_only)
        self.layout.check_metadata(checkpoint.get("pipeline"), path)
        settle_epoch_end(checkpoint)
        states = checkpoint.get("pipeline_state", {}).get("replicas", [])
        if states:
            self._load_rank_state(states[self.layout.replica])
        return checkpoint

    @override
    def remove_checkpoint(self, filepath: _PATH) -> None:
        if self.is_global_zero:
            checkpoint_sets.uncommit(filepath)  # the record goes first: a half-deleted set is not complete
        if self.layout is not None and self.layout.replica == 0:
            self.checkpoint_io.remove_checkpoint(self.shard_path(filepath))

    def _rank_state(self) -> dict:
        """What differs per replica: compression residuals, the generators and the evaluation
        loaders' workers (restored once the loaders are made, as ``server_aware_ddp`` does)."""
        state: dict = {"rng": self.rank_resume_state()}
        if self.runtime is not None and self.runtime.compressor is not None:
            state["backward"] = self.runtime.compressor.state_dict()
        if self.reducer is not None:
            state["dp"] = self.reducer.state_dict()
        return state

    def _load_rank_state(self, state: dict) -> None:
        rng = state.get("rng", {})
        if "generators" in rng:
            self.resume_rank_state(rng)
        elif "cpu" in rng:  # an older checkpoint: the torch generators alone, restored at once
            torch.set_rng_state(rng["cpu"].cpu())
            if "cuda" in rng and self.root_device.type == "cuda":
                torch.cuda.set_rng_state(rng["cuda"].cpu(), self.root_device)
        state = _move({k: v for k, v in state.items() if k != "rng"}, self.root_device)
        if self.runtime is not None and self.runtime.compressor is not None and "backward" in state:
            self.runtime.compressor.load_state_dict(state["backward"])
        if self.reducer is not None and "dp" in state:
            self.reducer.load_state_dict(state["dp"])

    # ------------------------------------------------------------------ registry
    @classmethod
    @override
    def register_strategies(cls, strategy_registry) -> None:
        strategy_registry.register(
            "compressed_pipeline", cls,
            description="DP x PP pipeline (1F1B) without compression: the Optimus-CC baseline",
            override=True,
        )
        strategy_registry.register(
            "optimus_cc", cls,
            description="Optimus-CC: pipeline with compressed backpropagation (LEP), fused embedding sync, selective DP compression",
            compress_backward=True, lep=True, fused_embedding=True, dp_compression=True, selective_stages=None,
            override=True,
        )


def stage_seed(seed: int, stage: int, replica: int) -> int:
    """A seed for ``(stage, replica)`` derived from the run's ``seed``: distinct for every pair,
    the same on every run."""
    return (seed * 1_000_003 + stage * 10_007 + replica + 1) % 2**63


def _move(state, device):
    if isinstance(state, torch.Tensor):
        return state.to(device)
    if isinstance(state, dict):
        return {k: _move(v, device) for k, v in state.items()}
    return state
