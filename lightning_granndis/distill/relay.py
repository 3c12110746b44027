"""Teacher Relaying (Pipe-BD §III-A): a stage passes its last teacher output (and the labels) to
the next stage, row by row, instead of every rank re-running the teacher from the input.

Stage ``k``'s rank ``j`` owns rows :func:`~lightning_granndis.distill.schedule.row_range` of each
step's batch; a sender sends every receiver of the next stage the rows they share (possibly
none), behind a small header, so stages of any data-parallel widths connect and short last
batches need no agreement up front. Sends are asynchronous: at most ``max_inflight`` steps stay in
flight before the sender waits for the oldest (back-pressure, so a fast stage cannot run away).
"""

from __future__ import annotations

from collections import deque

import torch

from lightning_granndis.comm import BookedWork, Communicator
from lightning_granndis.distill.schedule import DistillSchedule, row_range
from lightning_granndis.pipeline.p2p import MAX_DIMS, header_of, parse_header

#: what a relay message may carry, in this order
FIELDS = ("teacher", "labels", "student")
_HEAD = 4 + len(FIELDS) * (MAX_DIMS + 2)


class StageRelay:
    """The relay between one rank's stage and its neighbours.

    Args:
        comm: the booked communicator (traffic booked as ``teacher_relay``).
        schedule: the stage schedule.
        rank: this rank.
        device: where received tensors go.
        max_inflight: steps whose sends may be in flight at once (default 2).
    """

    def __init__(self, comm: Communicator, schedule: DistillSchedule, rank: int, device: torch.device,
                 max_inflight: int = 2) -> None:
        self.comm, self.schedule, self.rank, self.device = comm, schedule, rank, device
        self.stage = schedule.stage_of(rank)
        self.max_inflight = max(1, max_inflight)
        self.pending: deque[list[BookedWork]] = deque()

    def send(self, batch: int, start: int, tensors: dict[str, torch.Tensor]) -> None:
        """Sends this rank's rows ``[start, start + n)`` of a ``batch``-row step to the next stage."""
        if self.stage == self.schedule.num_stages - 1:
            return
        rows = next(iter(tensors.values())).shape[0] if tensors else 0
        nxt = self.stage + 1
        works: list[BookedWork] = []
        for j, dst in enumerate(self.schedule.ranks_of(nxt)):
            a, b = row_range(batch, self.schedule.widths[nxt], j)
            lo, hi = max(a, start), min(b, start + rows)
            n = max(0, hi - lo)
            head = torch.zeros(_HEAD, dtype=torch.int64)
            head[0], head[1], head[2] = batch, lo, n
            present = [name for name in FIELDS if name in tensors]
            head[3] = sum(1 << FIELDS.index(name) for name in present)
            for f, name in enumerate(FIELDS):
                if name in tensors:
                    head[4 + f * (MAX_DIMS + 2): 4 + (f + 1) * (MAX_DIMS + 2)] = header_of(tensors[name])
            works.append(self.comm.isend(head.to(self.device), dst, "teacher_relay"))
            if n:
                for name in present:
                    works.append(self.comm.isend(tensors[name][lo - start:hi - start].contiguous(), dst, "teacher_relay"))
        self.pending.append(works)
        while len(self.pending) > self.max_inflight:
            for w in self.pending.popleft():
                w.wait()

    def recv(self) -> tuple[int, int, dict[str, torch.Tensor]]:
        """``(batch, start, tensors)``: this rank's rows of the step the previous stage relays."""
        assert self.stage > 0, "the first stage reads data; it receives nothing"
        pieces: list[tuple[int, dict[str, torch.Tensor]]] = []
        batch, shapes = 0, {}
        for src in self.schedule.ranks_of(self.stage - 1):
            head = self.comm.recv(torch.zeros(_HEAD, dtype=torch.int64, device=self.device), src, "teacher_relay").cpu()
            batch, lo, n, mask = (int(v) for v in head[:4])
            names = [name for f, name in enumerate(FIELDS) if mask >> f & 1]
            for name in names:
                f = FIELDS.index(name)
                shapes[name] = parse_header(head[4 + f * (MAX_DIMS + 2): 4 + (f + 1) * (MAX_DIMS + 2)])
            if n:
                got = {}
                for name in names:
                    shape, dtype = shapes[name]
                    got[name] = self.comm.recv(torch.empty((n, *shape[1:]), dtype=dtype, device=self.device), src,
                                               "teacher_relay")
                pieces.append((lo, got))
        start, _ = row_range(batch, self.schedule.widths[self.stage], self.schedule.ranks_of(self.stage).index(self.rank))
        pieces.sort(key=lambda p: p[0])
        if not pieces:
            return batch, start, {}
        return batch, start, {name: torch.cat([p[1][name] for p in pieces]) for name in pieces[0][1]}

    def flush(self) -> None:
        """Completes every send still in flight."""
        while self.pending:
            for w in self.pending.popleft():
                w.wait()
