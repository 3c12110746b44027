"""Which blocks, groups and peers each rank of a DP x PP pipeline has."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import torch
from torch import nn

from lightning_granndis import comm
from lightning_granndis.pipeline.planner import Placement, StagePlan, place_stages, plan_stages
from lightning_granndis.topology import ServerTopology


class RemoteBlock(nn.Module):
    """Stands in for a block that lives on another stage (it holds no parameters)."""

    def __init__(self, index: int, stage: int) -> None:
        super().__init__()
        self.index, self.stage = index, stage

    def forward(self, *args, **kwargs):
        raise RuntimeError(
            f"block {self.index} runs on pipeline stage {self.stage}, not on this rank. For the whole model on one "
            "device, load the consolidated state dict (lightning_granndis.pipeline.consolidate_checkpoint)."
        )

    def extra_repr(self) -> str:
        return f"index={self.index}, stage={self.stage}"


@dataclass
class PipelineLayout:
    """This rank's place in the pipeline.

    ``plan``: blocks per stage; ``placement``: ranks of every replica's stages; ``replica``,
    ``stage``: this rank's; ``chain``: its replica's ranks; ``shared``: ``id(param) -> stages``
    holding a parameter used by blocks of more than one stage (tied embeddings).
    """

    plan: StagePlan
    placement: Placement
    replica: int
    stage: int
    num_blocks: int
    shared: dict[int, tuple[int, ...]] = field(default_factory=dict)
    chain_group: object = None
    dp_group: object = None
    shared_group_all: object = None
    shared_group_replica: object = None
    _blocks: list[tuple[int, nn.Module]] = field(default_factory=list, repr=False)

    @property
    def stages(self) -> int:
        return len(self.plan.balance)

    @property
    def chain(self) -> tuple[int, ...]:
        return self.placement.ranks[self.replica]

    def owned_blocks(self) -> list[tuple[int, nn.Module]]:
        return list(self._blocks)

    def counts_in_norm(self, param: nn.Parameter) -> bool:
        """Shared parameters count once in a norm over the stages: on the first stage holding them."""
        holders = self.shared.get(id(param))
        return holders is None or self.stage == holders[0]

    def metadata(self) -> dict:
        return {"stages": self.stages, "stage": self.stage, "balance": list(self.plan.balance),
                "blocks": self.num_blocks, "replicas": len(self.placement.ranks)}

    def check_metadata(self, meta: dict | None, path) -> None:
        """Refuses a shard written by another pipeline configuration, naming the difference."""
        if meta is None:
            raise ValueError(
                f"{path} is not a pipeline checkpoint (no 'pipeline' entry). To start a pipeline from single-device "
                "weights, load them into the module before trainer.fit instead of passing ckpt_path."
            )
        mine = self.metadata()
        diff = [f"{k}: checkpoint {meta.get(k)!r}, this run {v!r}" for k, v in mine.items() if meta.get(k) != v]
        if diff:
            raise ValueError(
                f"{path} was written by another pipeline configuration ({'; '.join(diff)}). Resume with the same "
                "stages and balance, or consolidate it (consolidate_checkpoint) and load the weights into a new run."
            )

    def describe(self) -> str:
        lines = [f"pipeline: {self.placement.describe()}"]
        for s in range(self.stages):
            blocks = self.plan.blocks(s)
            lines.append(f"  stage {s}: blocks {blocks.start}..{blocks.stop - 1}  cost {self.plan.stage_costs[s]:.3g}"
                         f"  memory {self.plan.stage_memory[s] / 2**20:.1f} MiB")
        return "\n".join(lines)


def _blocks_of(module) -> list[nn.Module]:
    blocks = list(module.pipeline_blocks())
    for i, b in enumerate(blocks):
        if not isinstance(b, nn.Module):
            raise TypeError(f"pipeline block {i} is a {type(b).__name__}, not an nn.Module.")
    return blocks


def profile_blocks(blocks: Sequence[nn.Module], example: torch.Tensor | None, repeats: int = 3
                   ) -> tuple[list[float], list[float]]:
    """``(cost, memory)`` per block: forward time x 3 (forward + backward ~ 3 forwards) on
    ``example``, or the parameter count without one; memory = 4 x parameter bytes (weights, grads,
    two Adam moments) + the block's output bytes."""
    params = [sum(p.numel() * p.element_size() for p in b.parameters()) for b in blocks]
    if example is None:
        return [float(max(1, p)) for p in params], [4.0 * p for p in params]
    costs, memory = [], []
    x = example
    with torch.no_grad():
        for b, pbytes in zip(blocks, params):
            b(x)  # warm-up
            t0 = time.perf_counter()
            for _ in range(repeats):
                y = b(x)
            costs.append(3 * (time.perf_counter() - t0) / repeats)
            memory.append(4.0 * pbytes + (y.numel() * y.element_size() if isinstance(y, torch.Tensor) else 0))
            x = y
    return costs, memory


def build_layout(module, topology: ServerTopology, stages: int, balance: Sequence[int] | None = None,
                 memory_cap: float | None = None, microbatches: int = 1,
                 device: torch.device | None = None, communicator: comm.Communicator | None = None) -> PipelineLayout:
    """Plans, places and splits ``module`` (collective: every rank calls it).

    Rank 0's parameters are broadcast first (set-up traffic: never emulated, booked in
    ``communicator``, a fresh one by default), so every replica and stage starts from the same
    model; then every rank replaces the blocks of other stages by :class:`RemoteBlock`.
    """
    blocks = _blocks_of(module)
    if len(blocks) < stages:
        raise ValueError(
            f"{type(module).__name__} has {len(blocks)} pipeline blocks but {stages} stages were requested: every "
            f"stage needs at least one block. Use stages <= {len(blocks)} or split the model into more blocks."
        )
    in_blocks = {id(p) for b in blocks for p in b.parameters()}
    loose = [n for n, p in module.named_parameters(remove_duplicate=False) if id(p) not in in_blocks]
    if loose:
        raise ValueError(
            f"parameters outside every pipeline block: {', '.join(loose[:5])}. Move them into a block (each stage "
            "keeps only its blocks' parameters)."
        )
    communicator = communicator or comm.Communicator(topology)
    for tensor in list(module.parameters()) + list(module.buffers()):
        communicator.broadcast(tensor.data, src=0, purpose="other")
    plan: StagePlan | None = None
    if comm.get_rank() == 0 or not comm.is_initialized():
        example = getattr(module, "example_input_array", None)
        if isinstance(example, torch.Tensor) and balance is None:
            rows = max(1, example.shape[0] // max(1, microbatches))
            example = example[:rows].to(device or example.device)
        else:
            example = None
        costs, memory = profile_blocks(blocks, example)
        plan = plan_stages(costs, stages, memory, memory_cap, balance)
    plan = comm.scatter_objects([plan] * comm.get_world_size() if comm.get_rank() == 0 else None) \
        if comm.is_initialized() and comm.get_world_size() > 1 else plan
    placement = place_stages(topology, stages)
    rank = comm.get_rank()
    replica, stage = placement.stage_of(rank)
    stage_of_block = [s for s in range(stages) for _ in plan.blocks(s)]
    holders: dict[int, set[int]] = {}
    for i, b in enumerate(blocks):
        for p in b.parameters():
            holders.setdefault(id(p), set()).add(stage_of_block[i])
    shared = {pid: tuple(sorted(s)) for pid, s in holders.items() if len(s) > 1}
    layout = PipelineLayout(plan, placement, replica, stage, len(blocks), shared)
    # Groups: collective, created in the same order on every rank.
    chains = [comm.topology_group(topology, chain) for chain in placement.ranks]
    layout.chain_group = chains[replica]
    dp_groups = [comm.topology_group(topology, [chain[s] for chain in placement.ranks]) for s in range(stages)]
    layout.dp_group = dp_groups[stage]
    holder_stages = sorted({s for stages_ in shared.values() for s in stages_})
    if holder_stages:
        every_holder = [chain[s] for chain in placement.ranks for s in holder_stages]
        layout.shared_group_all = comm.topology_group(topology, every_holder)
        per_replica = [comm.topology_group(topology, [chain[s] for s in holder_stages]) for chain in placement.ranks]
        layout.shared_group_replica = per_replica[replica]
    # Keep this stage's blocks; the others become placeholders without parameters.
    owned = set(plan.blocks(stage))
    names = {id(m): n for n, m in module.named_modules(remove_duplicate=False)}
    for i, b in enumerate(blocks):
        if i in owned:
            layout._blocks.append((i, b))
            continue
        parent_name, _, attr = names[id(b)].rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        setattr(parent, attr, RemoteBlock(i, stage_of_block[i]))  # nn.Sequential children too ("0", "1", ...)
    return layout
