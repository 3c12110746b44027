"""Pipelined blockwise distillation inside Lightning (Pipe-BD), and its two baselines."""

from __future__ import annotations

import os
from typing import Any, Callable, Mapping

import lightning.pytorch as pl
import torch
from lightning.fabric.utilities.optimizer import _optimizer_to_device
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from lightning_granndis import comm
from lightning_granndis.compression.powersgd import all_reduce_flat
from lightning_granndis.distill.ahd import BlockCosts, SearchResult, StageCostModel, search_schedule
from lightning_granndis.distill.blocks import check_blocks
from lightning_granndis.distill.profile import candidate_widths, feature_bytes_per_row, parameter_bytes, profile_blocks
from lightning_granndis.distill.runner import MODES, BlockwiseRunner
from lightning_granndis.distill.schedule import DistillSchedule
from lightning_granndis.link_model import LinkModel
from lightning_granndis.strategies.server_aware_ddp import ServerAwareDDPStrategy
from lightning_granndis.strategies.stage_loader import StageLoader


class PipeBDStrategy(ServerAwareDDPStrategy):
    """Blockwise distillation of a :class:`~lightning_granndis.distill.BlockwiseDistillation`
    across ranks: Pipe-BD (Jang et al., `Pipe-BD: Pipelined Parallel Blockwise Distillation
    <https://arxiv.org/abs/2301.12443>`_, DATE'23) and the DNA and LS baselines.

    ``mode="tr"`` is Pipe-BD. Ranks hold stages (consecutive blocks), possibly data-parallel.

    - **Teacher Relaying (TR)**: only the first stage reads data. Each stage runs its teacher
      blocks once, relays the last output (and the labels) to the next stage, and trains its
      student blocks on the guide features. Nothing travels backward.
    - **Decoupled Parameter Update (DPU)** (``dpu=True``): each rank steps its optimizer as soon
      as its backward ends. With ``dpu=False`` all ranks meet at a barrier before stepping.
    - **Automatic Hybrid Distribution (AHD)** (``schedule="auto"``): every block's teacher
      forward and student forward/backward are profiled at every candidate per-rank batch size.
      :func:`~lightning_granndis.distill.search_schedule` then picks the stage split and
      data-parallel widths with the smallest predicted step time: the bottleneck stage, or on CPU
      processes sharing fewer cores, the busy rank-seconds per core if larger. The all-reduce
      and relay costs come from the link model.

    ``mode="dna"`` trains every block data-parallel on every rank and re-runs the teacher from the
    input for each block. ``mode="ls"`` gives each rank a stage; the rank trains that stage on the
    whole batch and runs the teacher from the input. Every mode computes the same gradients as one
    process distilling all blocks on the whole batch.

    A step's batch is the DataLoader's batch. Each sample passes every block once per step, and a
    data-parallel stage splits the batch by rows.

    Args:
        mode: ``"tr"`` (default), ``"dna"`` or ``"ls"``.
        schedule: ``"auto"`` (AHD; ``"tr"`` only), ``"even"`` (one stage per rank, blocks split
            evenly), or the block lists per stage, e.g. ``[[0, 1], [2], [3, 4, 5]]``. Default:
            ``"auto"`` for ``"tr"``, ``"even"`` otherwise.
        dp_widths: ranks per stage for a list schedule (default one each).
        dpu: decoupled parameter updates (default ``True``).
        batch_size: rows per step for AHD's profile. The default reads the train DataLoader's.
        max_inflight: how many steps a stage may run ahead of the next (relay back-pressure).
        profile_repeats: timed repeats per block and batch size when profiling (median).
        servers, link_model, emulate: as in :class:`ServerAwareDDPStrategy`.
        **kwargs: passed on to Lightning's ``DDPStrategy``.

    Relay traffic is booked as ``teacher_relay`` and gradient averaging as ``grad_sync``. After
    ``fit``, every rank holds the whole trained student (``module.assemble_student()``).
    """

    strategy_name = "pipe_bd"

    def __init__(
        self,
        mode: str = "tr",
        schedule: str | list[list[int]] | None = None,
        dp_widths: list[int] | None = None,
        dpu: bool = True,
        batch_size: int | None = None,
        max_inflight: int = 2,
        profile_repeats: int = 3,
        servers: int | None = None,
        link_model: LinkModel | str | dict | None = "granndis_paper",
        emulate: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(servers=servers, link_model=link_model, emulate=emulate, hierarchical=False, **kwargs)
        if mode not in MODES:
            raise ValueError(f"unknown Pipe-BD mode {mode!r}; choose one of {', '.join(MODES)}.")
        if schedule is None:
            schedule = "auto" if mode == "tr" else "even"
        if isinstance(schedule, str) and schedule not in ("auto", "even"):
            raise ValueError(f"schedule must be 'auto', 'even' or block lists per stage, got {schedule!r}.")
        if schedule == "auto" and mode != "tr":
            raise ValueError(f"schedule='auto' (AHD) is Pipe-BD's: mode {mode!r} takes 'even' or block lists.")
        if dp_widths is not None and isinstance(schedule, str):
            raise ValueError("dp_widths go with a list schedule, e.g. schedule=[[0, 1], [2, 3]], dp_widths=[3, 1].")
        self.mode, self.schedule_spec, self.dp_widths, self.dpu = mode, schedule, dp_widths, dpu
        self.batch_size, self.max_inflight, self.profile_repeats = batch_size, max_inflight, profile_repeats
        self.schedule: DistillSchedule | None = None
        self.runner: BlockwiseRunner | None = None
        self.ahd: SearchResult | None = None
        #: after fit: predicted and measured step seconds, teacher block runs per batch per rank
        self.report: dict[str, Any] = {}
        self._resumed: dict | None = None

    @property
    @override
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        # Every rank that reads data sees the same step batches; stages split them by rows.
        return {"num_replicas": 1, "rank": 0}

    # ------------------------------------------------------------------ set-up
    @override
    def setup(self, trainer: pl.Trainer) -> None:
        self.setup_without_ddp(trainer, lambda: self._setup_runner(trainer))

    def _setup_runner(self, trainer: pl.Trainer) -> None:
        module = self.lightning_module
        for attr in ("teacher", "student", "block_loss", "distill_runner"):
            if not hasattr(module, attr):
                raise TypeError(
                    f"{type(module).__name__} cannot be distilled blockwise: it has no {attr}. Derive it from "
                    "lightning_granndis.distill.BlockwiseDistillation and give it teacher and student blocks."
                )
        if self.runner is not None:  # e.g. validate after fit
            module._distill_runner = self.runner
            return
        assert self.topology is not None and self.comm is not None
        example = module.example_input_array if isinstance(module.example_input_array, torch.Tensor) else None
        check_blocks(list(module.teacher), list(module.student),
                     example.to(self.root_device) if example is not None else None)
        setup_comm = comm.Communicator(self.topology)  # set-up traffic: never emulated
        for tensor in list(module.parameters()) + list(module.buffers()):
            setup_comm.broadcast(tensor.data, src=0, purpose="other")
        self.schedule = self._resolve_schedule(trainer, module)
        for k in range(self.schedule.num_stages):  # collective: every rank creates every stage's group
            comm.topology_group(self.topology, self.schedule.ranks_of(k))
        self.runner = BlockwiseRunner(list(module.teacher), list(module.student), module.block_loss, self.schedule,
                                      self.mode, self.global_rank, self.comm, self.root_device, self.max_inflight)
        module._distill_runner = self.runner
        rank_zero_info(f"Pipe-BD ({self.describe()}): schedule {self.schedule.describe()}")

    def describe(self) -> str:
        if self.mode == "dna":
            return "DNA baseline: every block data-parallel on every rank"
        if self.mode == "ls":
            return "LS baseline: a stage per rank, teacher re-run from the input"
        auto = "+AHD" if self.schedule_spec == "auto" else ""
        return f"TR{'+DPU' if self.dpu else ''}{auto}"

    def _resolve_schedule(self, trainer: pl.Trainer, module) -> DistillSchedule:
        n, world = module.num_blocks, self.world_size
        if self.mode == "dna":
            return DistillSchedule.build([list(range(n))], [world])
        spec = self.schedule_spec
        if spec == "auto":
            resumed = self._resumed
            if resumed and resumed.get("mode") == self.mode and resumed.get("world_size") == world:
                rank_zero_info("AHD: resuming with the checkpoint's schedule")
                return DistillSchedule.build(resumed["schedule"]["stages"], resumed["schedule"]["widths"])
            self.ahd = self._search(trainer, module)
            rank_zero_info(self.ahd.describe())
            return self.ahd.schedule.validate(n, world)
        if spec == "even":
            if n < world:
                raise ValueError(
                    f"schedule='even' puts one stage on each of the {world} ranks but the model has {n} blocks: "
                    "use schedule='auto', a list schedule with dp_widths, or fewer processes."
                )
            schedule = DistillSchedule.even(n, world)
        else:
            schedule = DistillSchedule.build(spec, self.dp_widths)
        schedule.validate(n, world)
        if self.mode == "ls" and any(w > 1 for w in schedule.widths):
            raise ValueError("the LS baseline gives each rank its own stage: it takes no dp_widths.")
        return schedule

    def _search(self, trainer: pl.Trainer, module) -> SearchResult:
        """Profiles the blocks and searches the schedule; every rank gets the same one."""
        example = module.example_input_array
        if not isinstance(example, torch.Tensor):
            raise ValueError(
                f"schedule='auto' profiles the blocks on {type(module).__name__}.example_input_array, which is not "
                "set: assign one sample's input (shape [1, ...]), or give a list schedule."
            )
        batch = self.batch_size or _train_batch_size(trainer)
        example = example[:1].to(self.root_device)
        widths = candidate_widths(batch, self.world_size)
        rank_zero_info(f"AHD: profiling {module.num_blocks} blocks at per-rank batches "
                       f"{sorted({-(-batch // g) for g in widths}, reverse=True)}")
        # Every rank profiles every candidate at once, so the timings carry the contention training
        # will see (ranks sharing CPU cores here; none on GPUs, one per rank); the mean over ranks.
        mine = {g: profile_blocks(list(module.teacher), list(module.student), example, -(-batch // g),
                                  module.block_loss, self.profile_repeats) for g in widths}
        parts = comm.gather_objects(mine)
        teacher = {g: [sum(p[g][0][i] for p in parts) / len(parts) for i in range(module.num_blocks)] for g in widths}
        student = {g: [sum(p[g][1][i] for p in parts) / len(parts) for i in range(module.num_blocks)] for g in widths}
        costs = BlockCosts(batch, teacher, student, parameter_bytes(list(module.student)),
                           feature_bytes_per_row(list(module.teacher), example))
        assert self.topology is not None
        model = StageCostModel(costs, self.link_model, self.topology.server_of, self._shared_devices())
        return search_schedule(model, self.world_size)

    def _shared_devices(self) -> float | None:
        """CPU cores the ranks share, in units of one rank's threads (``None``: a device each)."""
        if self.root_device.type != "cpu":
            return None
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        devices = self.num_nodes * max(1, cores // torch.get_num_threads())
        return float(devices) if devices < self.world_size else None

    @override
    def process_dataloader(self, dataloader: object) -> object:
        # Ranks that need no data (later stages) iterate placeholders of the same length.
        def loads() -> bool:
            assert self.runner is not None
            return self.runner.loads_data(self.lightning_module.trainer.training)

        dataloader = self.resumable_loader(dataloader)
        self.restore_resumed_random_state()
        return StageLoader(dataloader, loads)

    # ------------------------------------------------------------------ step
    @override
    def optimizer_step(self, optimizer, closure: Callable[[], Any], model=None, **kwargs: Any) -> Any:
        def closure_then_sync() -> Any:
            out = closure()
            self._sync_stage_gradients()
            if not self.dpu:  # TR without DPU: every rank waits for every other before stepping
                comm.barrier()
            return out

        return super().optimizer_step(optimizer, closure_then_sync, model, **kwargs)

    def _sync_stage_gradients(self) -> None:
        """Averages this stage's student gradients over the stage's ranks (rows were weighted so
        that this is the whole batch's gradient)."""
        assert self.runner is not None and self.schedule is not None and self.topology is not None
        if self.runner.width == 1:
            return
        params = self.runner.owned_params()
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        group = comm.topology_group(self.topology, self.schedule.ranks_of(self.runner.stage))
        all_reduce_flat([p.grad for p in params], self.comm, group, self.runner.width, "grad_sync")

    def sync_student(self) -> None:
        """Every rank gets every trained student block (parameters and buffers) from the first rank
        of the stage that trains it (collective)."""
        assert self.runner is not None and self.schedule is not None and self.comm is not None
        if self.schedule.num_stages == 1:
            return
        module = self.lightning_module
        for k, blocks in enumerate(self.schedule.stages):
            tensors = [t for i in blocks for t in list(module.student[i].parameters()) + list(module.student[i].buffers())
                       if t.is_floating_point()]
            if tensors:
                flat = torch.cat([t.detach().reshape(-1) for t in tensors])
                self.comm.broadcast(flat, src=self.schedule.first_rank(k), purpose="other")
                offset = 0
                for t in tensors:
                    t.data.copy_(flat[offset:offset + t.numel()].view_as(t))
                    offset += t.numel()

    @override
    def on_train_end(self) -> None:
        super().on_train_end()
        assert self.runner is not None
        self.runner.flush()
        self.sync_student()
        steps = comm.gather_objects(self.runner.mean_step_seconds())
        execs = comm.gather_objects(self.runner.teacher_execs_per_batch())
        measured = max(steps)
        self.report = {"schedule": self.schedule.to_dict() if self.schedule else None, "measured_step_s": measured,
                       "teacher_execs_per_batch": execs}
        line = f"Pipe-BD ({self.describe()}) schedule {self.schedule.describe() if self.schedule else '-'}: " \
               f"measured {measured * 1e3:.1f} ms/step"
        if self.ahd is not None:
            self.report["predicted_step_s"] = self.ahd.predicted_s
            line += f", AHD predicted {self.ahd.predicted_s * 1e3:.1f} ms/step"
        rank_zero_info(line + f"; teacher block runs per batch per rank {execs}")

    @override
    def teardown(self) -> None:
        if self.runner is not None:
            self.runner.flush()
        module = self._lightning_module
        if module is not None and getattr(module, "_distill_runner", None) is self.runner:
            module._distill_runner = None
        super().teardown()

    # ------------------------------------------------------------------ checkpoints
    @override
    def lightning_module_state_dict(self) -> dict[str, Any]:
        # The checkpoint holds the whole trained student, usable on any number of devices.
        if self.runner is not None:
            self.sync_student()
        return super().lightning_module_state_dict()

    @override
    def optimizer_state(self, optimizer) -> dict[str, Any]:
        # Each rank steps only its own blocks: keep every rank's optimizer state (collective).
        state = _to_cpu(optimizer.state_dict())
        return {"pipe_bd_per_rank": comm.gather_objects(state)}

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: _PATH, storage_options: Any | None = None) -> None:
        checkpoint["pipe_bd"] = self.metadata()
        super().save_checkpoint(checkpoint, filepath, storage_options)

    def metadata(self) -> dict[str, Any]:
        return {"mode": self.mode, "world_size": self.world_size,
                "schedule": self.schedule.to_dict() if self.schedule is not None else None}

    @override
    def load_checkpoint(self, checkpoint_path: _PATH, weights_only: bool | None = None) -> dict[str, Any]:
        checkpoint = super().load_checkpoint(checkpoint_path, weights_only=True if weights_only is None else weights_only)
        self._resumed = checkpoint.get("pipe_bd")
        return checkpoint

    @override
    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        for optimizer, state in zip(self.optimizers, checkpoint["optimizer_states"]):
            if "pipe_bd_per_rank" in state:
                saved = checkpoint.get("pipe_bd") or {}
                if saved != self.metadata():
                    raise ValueError(
                        f"this checkpoint's optimizer states come from another Pipe-BD configuration: saved "
                        f"{saved}, this run {self.metadata()}. Resume with the same mode, schedule and world size, "
                        "or start a new run from its weights alone (Module.load_from_checkpoint(path))."
                    )
                state = state["pipe_bd_per_rank"][self.global_rank]
            optimizer.load_state_dict(state)  # a one-device state: each rank uses its own blocks' part
            _optimizer_to_device(optimizer, self.root_device)

    # ------------------------------------------------------------------ registry
    @classmethod
    @override
    def register_strategies(cls, strategy_registry) -> None:
        strategy_registry.register(
            "pipe_bd", cls, description="Pipe-BD: teacher relaying, decoupled updates, automatic hybrid distribution",
            mode="tr", schedule="auto", dpu=True, override=True)
        strategy_registry.register(
            "pipe_bd_tr", cls, description="Pipe-BD's teacher relaying alone (a stage per rank, barrier before each step)",
            mode="tr", schedule="even", dpu=False, override=True)
        strategy_registry.register(
            "pipe_bd_tr_dpu", cls, description="Pipe-BD's teacher relaying with decoupled parameter updates",
            mode="tr", schedule="even", dpu=True, override=True)
        strategy_registry.register(
            "pipe_bd_dna", cls, description="DNA-style blockwise distillation: every block data-parallel, teacher re-run",
            mode="dna", schedule="even", override=True)
        strategy_registry.register(
            "pipe_bd_ls", cls, description="LS blockwise distillation: a stage per rank, teacher re-run from the input",
            mode="ls", schedule="even", override=True)


def _train_batch_size(trainer: pl.Trainer) -> int:
    """The train DataLoader's batch size, read without loading data."""
    try:
        loader = trainer.fit_loop._data_source.dataloader()
        size = getattr(loader, "batch_size", None) or getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
    except Exception:  # noqa: BLE001 - any failure means: ask the user
        size = None
    if not size:
        raise ValueError("schedule='auto' needs the step's batch size to profile: pass PipeBDStrategy(batch_size=...).")
    return int(size)


def _to_cpu(state):
    if isinstance(state, torch.Tensor):
        return state.cpu()
    if isinstance(state, dict):
        return {k: _to_cpu(v) for k, v in state.items()}
    if isinstance(state, list):
        return [_to_cpu(v) for v in state]
    return state
