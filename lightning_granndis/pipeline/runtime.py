"""Runs one stage of a pipeline: its blocks, its schedule, its sends and receives.

Optimus-CC's Compressed Backpropagation (Song et al., `Optimus-CC: Efficient Large NLP Model
Training with 3D Parallelism Aware Communication Compression <https://arxiv.org/abs/2301.09830>`_,
ASPLOS'23) lives here: the activation gradient :math:`G` a stage sends backward over a compressed
boundary is replaced by rank-:math:`r` factors (one power iteration, warm-started :math:`Q`),

.. math::
    M = G + e,\\quad P = \\mathrm{orth}(M Q),\\quad Q \\leftarrow M^\\top P,\\quad
    \\tilde G = P Q^\\top,\\quad e \\leftarrow M - \\tilde G,

where Lazy Error Propagation keeps one residual :math:`e` per stage and adds it to the next
compressed gradient, across micro-batches and iterations.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from torch import nn

from lightning_granndis.comm import Communicator
from lightning_granndis.compression.low_rank import LowRankCompressor
from lightning_granndis.pipeline.module import batch_rows, micro_ranges, slice_batch
from lightning_granndis.pipeline.p2p import MAX_DIMS, StageLink, header_of, parse_header
from lightning_granndis.pipeline.schedules import Action, build_schedule


@dataclass
class BackwardCompression:
    """Compressed Backpropagation settings.

    Args:
        rank: rank ``r`` of the sent factors (default 16).
        lep: Lazy Error Propagation, the carried residual (default ``True``).
        epilogue_only: compress only the backward sends of the schedule's flush (default ``False``).
        boundaries: indices ``b`` of the boundaries ``b -> b+1`` to compress.
    """

    rank: int = 16
    lep: bool = True
    epilogue_only: bool = False
    boundaries: frozenset[int] = field(default_factory=frozenset)


class PipelineRuntime:
    """One stage of one pipeline replica.

    Args:
        stage: this rank's stage index ``s``.
        chain: the global ranks of this replica's stages, in order.
        blocks: ``(global index, module)`` of the blocks this stage runs, in order.
        comm: the booked communicator.
        schedule: ``"1f1b"`` (default) or ``"gpipe"``.
        micro_batches: micro-batches per batch (fewer when a batch has fewer rows).
        compression: Compressed Backpropagation settings, or ``None``.
        chain_group: process group over ``chain`` (to report the loss on every stage).
        device: the stage's device.

    ``runtime(module, batch)`` runs the batch through the pipeline and returns its loss on every
    stage: the row-weighted mean of the micro-batch losses, which is the batch's mean loss. With
    gradients enabled it also runs the backward; the gradients of this stage's parameters are kept
    in :attr:`grads` (not in ``.grad``, which Lightning may zero after the step function), for
    :meth:`apply_grads`.
    """

    def __init__(self, stage: int, chain: Sequence[int], blocks: Sequence[tuple[int, nn.Module]],
                 comm: Communicator, schedule: str = "1f1b", micro_batches: int = 4,
                 compression: BackwardCompression | None = None, chain_group=None,
                 device: torch.device | None = None) -> None:
        self.stage, self.chain, self.blocks = stage, list(chain), list(blocks)
        self.stages = len(self.chain)
        self.comm, self.schedule, self.micro_batches = comm, schedule, micro_batches
        self.compression, self.chain_group = compression, chain_group
        self.device = device or torch.device("cpu")
        build_schedule(schedule, self.stages, max(1, micro_batches))  # validate early
        self.link = StageLink(comm, self.device)
        self.compressor = (LowRankCompressor(compression.rank, error_feedback=compression.lep)
                           if compression is not None else None)
        seen: dict[int, nn.Parameter] = {}
        for _, block in self.blocks:
            for p in block.parameters():
                seen.setdefault(id(p), p)
        self.params = list(seen.values())
        self.grads: list[torch.Tensor | None] | None = None

    @property
    def first(self) -> bool:
        return self.stage == 0

    @property
    def last(self) -> bool:
        return self.stage == self.stages - 1

    # ------------------------------------------------------------------ compression policy
    def grad_rank(self, sender: int, action: Action) -> int | None:
        """The rank with which stage ``sender`` sends the gradient of ``action`` (``None``: whole)."""
        cb = self.compression
        if cb is None or sender - 1 not in cb.boundaries or (cb.epilogue_only and not action.epilogue):
            return None
        return cb.rank

    def _backward_action(self, stage: int, micro: int, plan: list[list[Action]]) -> Action:
        return next(a for a in plan[stage] if a.kind == "B" and a.micro == micro)

    # ------------------------------------------------------------------ blocks
    def forward_blocks(self, x: torch.Tensor) -> torch.Tensor:
        for index, block in self.blocks:
            x = block(x)
            if not isinstance(x, torch.Tensor):
                raise TypeError(
                    f"pipeline block {index} ({type(block).__name__}) returned {type(x).__name__}; every block must "
                    "take and return one tensor. Pack several values into one tensor, or merge the blocks."
                )
        return x

    # ------------------------------------------------------------------ one batch
    def __call__(self, module, batch: Any, return_outputs: bool = False):
        """The batch's loss on every stage (and, with ``return_outputs``, the last block's
        outputs for the whole batch, detached, on every stage too)."""
        def loss_of(y, micro):
            if self.stages == 1:
                return module.pipeline_loss(y, micro)
            own = module.__dict__.get("log")
            module.log = _log_refused  # a value logged here would exist on the last stage only
            try:
                return module.pipeline_loss(y, micro)
            finally:
                if own is None:
                    del module.log
                else:
                    module.log = own

        return self._run(batch, module.pipeline_input, loss_of, return_outputs)

    def forward_outputs(self, x: torch.Tensor) -> torch.Tensor:
        """The last block's output for the first block's input ``x``, on every stage: a
        forward-only pass through the pipeline (what ``module(x)`` means under the strategy)."""
        if torch.is_grad_enabled():
            raise RuntimeError(
                "under the pipeline, module(x) returns outputs without a backward (they come from the last stage): "
                "call it under torch.no_grad() (validation, test and predict already are), or get the loss and the "
                "outputs of a training batch with self.pipeline_step(batch, return_outputs=True)."
            )
        return self._run(x, lambda micro: micro, None, True)[1]

    def _run(self, batch: Any, input_of, loss_of, keep_outputs: bool):
        train = torch.is_grad_enabled() and loss_of is not None
        rows = batch_rows(batch)
        ranges = micro_ranges(rows, self.micro_batches)
        micro = [slice_batch(batch, a, b) for a, b in ranges]
        weights = [(b - a) / rows for a, b in ranges]
        plan = build_schedule(self.schedule, self.stages, len(ranges))
        actions = plan[self.stage] if train else [Action("F", i) for i in range(len(ranges))]
        if train:
            saved = [p.grad for p in self.params]
            for p in self.params:
                p.grad = None
        inputs: dict[int, torch.Tensor] = {}
        outputs: dict[int, torch.Tensor] = {}
        losses: dict[int, torch.Tensor] = {}
        kept: dict[int, torch.Tensor] = {}
        prev = self.chain[self.stage - 1] if not self.first else None
        nxt = self.chain[self.stage + 1] if not self.last else None
        for action in actions:
            i = action.micro
            if action.kind == "F":
                if self.first:
                    x = input_of(micro[i])
                else:
                    x = self.link.recv_activation(prev)
                    if train and x.is_floating_point():
                        x.requires_grad_(True)
                y = self.forward_blocks(x)
                if self.last:
                    if keep_outputs:
                        kept[i] = y.detach()
                    if loss_of is not None:
                        loss = loss_of(y, micro[i])
                        losses[i] = loss.detach()
                        outputs[i] = loss * weights[i]
                else:
                    self.link.send_activation(y, nxt)
                    outputs[i] = y
                if train:
                    inputs[i] = x
                else:
                    outputs.pop(i, None)
            else:
                out = outputs.pop(i)
                if self.last:
                    grad = None
                else:
                    rank = self.grad_rank(self.stage + 1, self._backward_action(self.stage + 1, i, plan))
                    grad = self.link.recv_grad(out, nxt, rank)
                if out.requires_grad:
                    torch.autograd.backward(out, grad)
                x = inputs.pop(i)
                if not self.first:
                    g = x.grad if x.grad is not None else torch.zeros_like(x)
                    rank = self.grad_rank(self.stage, action)
                    self.link.send_grad(g, prev, self.compressor if rank is not None else None,
                                        stream=f"boundary{self.stage - 1}")
        self.link.wait()
        if train:
            self.grads = [p.grad for p in self.params]
            for p, g in zip(self.params, saved):
                p.grad = g
        result = None
        if keep_outputs:
            result = torch.cat([kept[i] for i in range(len(ranges))]) if self.last else None
            result = self._from_last_stage(result)
        if loss_of is None:
            return None, result
        loss = torch.zeros((), device=self.device)
        if self.last:
            loss = sum(w * losses[i] for i, w in enumerate(weights)).to(self.device).float()
        if self.stages > 1:
            self.comm.broadcast(loss, src=self.chain[-1], purpose="other", group=self.chain_group)
        return (loss, result) if keep_outputs else loss

    def _from_last_stage(self, tensor: torch.Tensor | None) -> torch.Tensor:
        """``tensor`` (held by the last stage) on every stage of the chain: a shape header, then
        the data (booked as ``other``)."""
        if self.stages == 1:
            return tensor
        src = self.chain[-1]
        head = header_of(tensor).to(self.device) if self.last else torch.zeros(MAX_DIMS + 2, dtype=torch.int64,
                                                                               device=self.device)
        self.comm.broadcast(head, src=src, purpose="other", group=self.chain_group)
        if not self.last:
            shape, dtype = parse_header(head.cpu())
            tensor = torch.empty(shape, dtype=dtype, device=self.device)
        self.comm.broadcast(tensor.contiguous() if self.last else tensor, src=src, purpose="other",
                            group=self.chain_group)
        return tensor

    def apply_grads(self, scale: float = 1.0) -> None:
        """Adds the gradients of the last training batch, times ``scale``, into ``.grad``."""
        if self.grads is None:
            return
        for p, g in zip(self.params, self.grads):
            if g is None:
                continue
            g = g * scale if scale != 1.0 else g
            p.grad = g.clone() if p.grad is None else p.grad.add_(g)
        self.grads = None


def _log_refused(name: str, *args: Any, **kwargs: Any) -> None:
    raise RuntimeError(
        f"self.log({name!r}, ...) inside pipeline_loss: under the pipeline, pipeline_loss runs on the last stage "
        "only, so the value would exist on one rank (ModelCheckpoint or EarlyStopping monitoring it would fail on "
        "the others). Compute the metric in your step from `loss, outputs = self.pipeline_step(batch, "
        "return_outputs=True)` (or `self(x)` without gradients) and log it there: the outputs are on every rank."
    )
