"""One rank's share of a blockwise-distillation step, for Pipe-BD and its two baselines.

- ``"tr"`` (Teacher Relaying, Pipe-BD §III-A): the rank's stage receives the previous stage's
  last teacher output, runs its own teacher blocks once, relays onward and trains its student
  blocks. Only the first stage reads data.
- ``"dna"`` (DNA-style data parallelism): every rank trains every block on its rows of the batch,
  re-running the teacher from the input for each block: ``N(N+1)/2`` teacher block runs.
- ``"ls"`` (task parallelism): each rank trains its stage's blocks on the whole batch, running
  the teacher from the input to its last block.

All three compute the same gradients as one process distilling every block on the whole batch:
a rank holding ``n`` of a step's ``B`` rows in a stage of ``g`` ranks scales its (mean) loss by
``n g / B`` so that the stage's averaged gradient is the whole batch's.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

import torch
from torch import nn

from lightning_granndis.comm import Communicator
from lightning_granndis.distill.blocks import TeacherCounter, check_output, guide_features
from lightning_granndis.distill.relay import StageRelay
from lightning_granndis.distill.schedule import DistillSchedule, row_range

MODES = ("tr", "dna", "ls")
BlockLoss = Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor]


class BlockwiseRunner:
    """Runs training and evaluation steps of one rank.

    Args:
        teacher: the teacher blocks (frozen, in eval mode).
        student: the student blocks.
        block_loss: ``(index, student_out, teacher_out) -> loss`` (a mean over rows).
        schedule: stages and widths (``"dna"``: one stage of every block on every rank).
        mode: ``"tr"``, ``"dna"`` or ``"ls"``.
        rank: this rank (0 in one process).
        comm: the booked communicator, or ``None`` in one process.
        device: this rank's device.
        max_inflight: relay back-pressure (steps in flight).
    """

    def __init__(self, teacher: Sequence[nn.Module], student: Sequence[nn.Module], block_loss: BlockLoss,
                 schedule: DistillSchedule, mode: str = "tr", rank: int = 0, comm: Communicator | None = None,
                 device: torch.device | None = None, max_inflight: int = 2) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown Pipe-BD mode {mode!r}; choose one of {', '.join(MODES)}.")
        self.teacher, self.student, self.block_loss = teacher, student, block_loss
        self.schedule, self.mode, self.rank, self.comm = schedule, mode, rank, comm
        self.device = device or torch.device("cpu")
        self.stage = schedule.stage_of(rank)
        self.width = schedule.widths[self.stage]
        self.index = schedule.ranks_of(self.stage).index(rank)
        self.owned = list(schedule.stages[self.stage])
        self.relay = StageRelay(comm, schedule, rank, self.device, max_inflight) \
            if comm is not None and schedule.num_stages > 1 else None
        self.counter = TeacherCounter(len(teacher))
        self.train_batches = 0
        self.step_starts: list[float] = []
        n = len(teacher)
        self._epoch = torch.zeros(2 * n, dtype=torch.float64)  # per block: sum of loss x rows, rows

    # ------------------------------------------------------------------ data
    def loads_data(self, training: bool) -> bool:
        """Whether this rank reads batches (``tr``: the first stage only; evaluation relays in
        ``ls`` too; ``dna``: every rank)."""
        if self.mode == "dna" or (self.mode == "ls" and training):
            return True
        return self.stage == 0

    def owned_params(self) -> list[nn.Parameter]:
        return [p for i in self.owned for p in self.student[i].parameters() if p.requires_grad]

    def _input_rows(self, x: torch.Tensor, y: torch.Tensor | None, parts: int, index: int):
        batch = x.shape[0]
        lo, hi = row_range(batch, parts, index)
        return batch, lo, x[lo:hi], (y[lo:hi] if y is not None else None)

    def _receive_or_read(self, batch_data) -> tuple[int, int, dict[str, torch.Tensor]]:
        if self.stage == 0 or self.relay is None:
            x, y = batch_data
            batch, lo, x, y = self._input_rows(x, y, self.width, self.index)
            if x.shape[0] == 0:  # a batch with fewer rows than the stage has ranks
                return batch, lo, {}
            got = {"teacher": x}
            if y is not None:
                got["labels"] = y
            return batch, lo, got
        return self.relay.recv()

    # ------------------------------------------------------------------ training
    def train_step(self, batch_data) -> torch.Tensor:
        """The (scaled) loss of this rank's blocks, ready for ``backward()``; ``batch_data`` is
        ``(x, y)`` where this rank reads data and ignored elsewhere."""
        self.step_starts.append(time.perf_counter())
        self.train_batches += 1
        if self.mode == "dna":
            x, y = batch_data
            batch, _, x, _ = self._input_rows(x, y, self.width, self.index)
            rows = x.shape[0]
            if rows == 0:
                return self._student_loss({}, 0, batch)
            guides = {}
            for i in self.owned:  # the DNA baseline re-runs the teacher from the input for every block
                inputs, outputs = guide_features(self.teacher, x, 0, i, self.counter)
                guides[i] = (inputs[-1], outputs[-1])
            return self._student_loss(guides, rows, batch)
        if self.mode == "ls":
            x, _ = batch_data
            inputs, outputs = guide_features(self.teacher, x, 0, self.owned[-1], self.counter)
            guides = {i: (inputs[i], outputs[i]) for i in self.owned}
            return self._student_loss(guides, x.shape[0], x.shape[0])
        batch, start, got = self._receive_or_read(batch_data)
        if not got:  # this step has fewer rows than the stage has ranks: nothing here
            if self.relay is not None:
                self.relay.send(batch, start, {})
            return self._student_loss({}, 0, batch)
        inputs, outputs = guide_features(self.teacher, got["teacher"], self.owned[0], self.owned[-1], self.counter)
        if self.relay is not None:
            out = {"teacher": outputs[-1]}
            if "labels" in got:
                out["labels"] = got["labels"]
            self.relay.send(batch, start, out)
        guides = {i: (inputs[k], outputs[k]) for k, i in enumerate(self.owned)}
        return self._student_loss(guides, got["teacher"].shape[0], batch)

    def _student_loss(self, guides: dict, rows: int, batch: int) -> torch.Tensor:
        params = self.owned_params()
        total = sum((p.sum() * 0.0 for p in params), torch.zeros((), device=self.device))
        if rows == 0:
            return total
        scale = rows * self.width / batch
        for i, (x_in, t_out) in guides.items():
            s_out = self.student[i](x_in)
            check_output(i, s_out, t_out)
            loss = self.block_loss(i, s_out, t_out)
            self._epoch[i] += float(loss.detach()) * rows
            self._epoch[len(self.teacher) + i] += rows
            total = total + loss * scale
        return total

    def epoch_losses(self) -> list[float]:
        """Mean training loss of every block over the epoch so far (collective in a distributed
        run: every rank gets all blocks'); resets the sums."""
        sums = self._epoch.clone()
        if self.comm is not None:
            self.comm.all_reduce(sums, "other")
        self._epoch.zero_()
        n = len(self.teacher)
        return [float(sums[i] / sums[n + i]) if sums[n + i] > 0 else float("nan") for i in range(n)]

    # ------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def eval_step(self, batch_data) -> dict[str, float]:
        """Per-block losses (teacher-guided, as in training), and the accuracy of the student
        assembled end to end and of the teacher, on this step's batch; the same on every rank."""
        n = len(self.teacher)
        acc = torch.zeros(n + 3, dtype=torch.float64)  # block loss x rows; student, teacher correct; labelled rows
        if self.mode == "dna":
            x, y = batch_data
            batch, start, x, y = self._input_rows(x, y, self.width, self.index)
            got = {"teacher": x, "student": x} if x.shape[0] else {}
            if y is not None and got:
                got["labels"] = y
            blocks = list(range(n))
            last_stage = True
        else:
            if self.stage == 0 or self.relay is None:
                batch, start, got = self._receive_or_read(batch_data)
                if got:
                    got["student"] = got["teacher"]
            else:
                batch, start, got = self.relay.recv()
            blocks = self.owned
            last_stage = self.stage == self.schedule.num_stages - 1
        if got:
            t, s = got["teacher"], got["student"]
            rows = t.shape[0]
            for i in blocks:
                t_out = self.teacher[i](t)
                s_guided = self.student[i](t)
                check_output(i, s_guided, t_out)
                acc[i] += float(self.block_loss(i, s_guided, t_out)) * rows
                s = self.student[i](s)
                t = t_out
            if self.relay is not None and not last_stage:
                out = {"teacher": t, "student": s}
                if "labels" in got:
                    out["labels"] = got["labels"]
                self.relay.send(batch, start, out)
            if last_stage and "labels" in got and t.dim() == 2:
                acc[n] += float((s.argmax(-1) == got["labels"]).sum())
                acc[n + 1] += float((t.argmax(-1) == got["labels"]).sum())
                acc[n + 2] += rows
        elif self.relay is not None and not last_stage:
            self.relay.send(batch, start, {})
        if self.comm is not None:
            self.comm.all_reduce(acc, "other")
        rows_total = float(acc[n + 2]) if acc[n + 2] > 0 else float(batch)
        out = {f"block{i}_loss": float(acc[i]) / batch for i in range(n)}
        out["loss"] = sum(out[f"block{i}_loss"] for i in range(n))
        if acc[n + 2] > 0:
            out["student_acc"] = float(acc[n]) / rows_total
            out["teacher_acc"] = float(acc[n + 1]) / rows_total
        out["rows"] = batch
        return out

    # ------------------------------------------------------------------ bookkeeping
    def teacher_execs_per_batch(self) -> float:
        return self.counter.total / max(1, self.train_batches)

    def mean_step_seconds(self, skip: int = 2) -> float:
        """Mean interval between this rank's consecutive training steps, after ``skip`` warm-up steps."""
        starts = self.step_starts[skip:]
        if len(starts) < 2:
            return float("nan")
        return (starts[-1] - starts[0]) / (len(starts) - 1)

    def flush(self) -> None:
        if self.relay is not None:
            self.relay.flush()
