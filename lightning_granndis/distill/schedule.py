"""Which ranks hold which blocks: Pipe-BD's stage schedule (blocks per stage x data-parallel width).

Pipe-BD (Jang et al., DATE'23, §III) places *stages* — consecutive ranges of blocks — on
consecutive ranks; a stage may be data-parallel over several ranks (Automatic Hybrid
Distribution), which split each step's batch by rows. Stage ``k`` of width ``g_k`` holds ranks
``sum(g_0..g_{k-1}) .. + g_k - 1``; its rank ``j`` owns rows :func:`row_range` ``(B, g_k, j)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


def row_range(batch: int, parts: int, index: int) -> tuple[int, int]:
    """Rows ``[start, stop)`` of a ``batch``-row step that part ``index`` of ``parts`` owns: shares
    that differ by at most one row (floor division of the bounds)."""
    return index * batch // parts, (index + 1) * batch // parts


@dataclass(frozen=True)
class DistillSchedule:
    """Stages (consecutive block ranges) and the data-parallel width of each.

    Args:
        stages: block indices per stage, e.g. ``[[0, 1], [2], [3, 4, 5]]``.
        widths: ranks per stage (default one each).
    """

    stages: tuple[tuple[int, ...], ...]
    widths: tuple[int, ...]

    @classmethod
    def build(cls, stages: Sequence[Sequence[int]], widths: Sequence[int] | None = None) -> "DistillSchedule":
        stages_t = tuple(tuple(int(b) for b in s) for s in stages)
        widths_t = tuple(int(w) for w in widths) if widths is not None else (1,) * len(stages_t)
        return cls(stages_t, widths_t)

    @classmethod
    def even(cls, num_blocks: int, num_stages: int) -> "DistillSchedule":
        """``num_stages`` stages of (nearly) equal block counts, one rank each."""
        bounds = [row_range(num_blocks, num_stages, k) for k in range(num_stages)]
        return cls.build([list(range(a, b)) for a, b in bounds])

    # ------------------------------------------------------------------ checks
    def validate(self, num_blocks: int, world_size: int) -> "DistillSchedule":
        """Raises a ``ValueError`` naming the problem unless the stages cover blocks
        ``0..num_blocks-1`` once each, in order, and the widths use exactly ``world_size`` ranks."""
        if not self.stages or any(len(s) == 0 for s in self.stages):
            raise ValueError(f"schedule {self.describe()}: every stage needs at least one block.")
        if len(self.widths) != len(self.stages):
            raise ValueError(
                f"schedule {self.describe()}: {len(self.stages)} stages but {len(self.widths)} dp_widths; give one "
                "width per stage."
            )
        flat = [b for s in self.stages for b in s]
        if flat != list(range(num_blocks)):
            missing = sorted(set(range(num_blocks)) - set(flat))
            extra = sorted(set(flat) - set(range(num_blocks)))
            raise ValueError(
                f"schedule {self.describe()} must cover blocks 0..{num_blocks - 1} once each, in consecutive "
                f"stages (missing {missing}, unknown {extra}, order {flat})."
            )
        if any(w < 1 for w in self.widths):
            raise ValueError(f"schedule {self.describe()}: every stage needs at least one rank.")
        if sum(self.widths) != world_size:
            raise ValueError(
                f"schedule {self.describe()} uses {sum(self.widths)} ranks but the world has {world_size} "
                f"(devices x num_nodes): make dp_widths sum to {world_size}, or launch {sum(self.widths)} processes."
            )
        return self

    # ------------------------------------------------------------------ placement
    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def world_size(self) -> int:
        return sum(self.widths)

    def first_rank(self, stage: int) -> int:
        return sum(self.widths[:stage])

    def ranks_of(self, stage: int) -> list[int]:
        start = self.first_rank(stage)
        return list(range(start, start + self.widths[stage]))

    def stage_of(self, rank: int) -> int:
        for k in range(self.num_stages):
            if rank in self.ranks_of(k):
                return k
        raise ValueError(f"rank {rank} is outside schedule {self.describe()}.")

    def stage_of_block(self, block: int) -> int:
        return next(k for k, s in enumerate(self.stages) if block in s)

    def describe(self) -> str:
        parts = [f"{list(s)}x{w}" if w > 1 else f"{list(s)}" for s, w in zip(self.stages, self.widths)]
        return "[" + ", ".join(parts) + "]"

    def to_dict(self) -> dict:
        return {"stages": [list(s) for s in self.stages], "widths": list(self.widths)}
