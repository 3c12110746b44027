"""Point-to-point traffic between neighbouring pipeline stages.

Activations travel with a small header (rank, dtype, shape), so stages accept micro-batches whose
shapes vary (a short last batch, variable sequence lengths) without agreeing on shapes up front.
Activation gradients need no header: the receiver knows the shape of the output they belong to.
A gradient may travel compressed as the two low-rank factors ``P [n, r]`` and ``Q [m, r]``.
"""

from __future__ import annotations

import torch

from lightning_granndis.comm import BookedWork, Communicator
from lightning_granndis.compression.low_rank import LowRankCompressor, low_rank_pays

MAX_DIMS = 8
_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.bool,
           torch.uint8, torch.int8, torch.int16]
_CODE = {d: i for i, d in enumerate(_DTYPES)}


def header_of(tensor: torch.Tensor) -> torch.Tensor:
    """``[ndim, dtype code, *shape, 0...]`` as ``MAX_DIMS + 2`` int64."""
    if tensor.dim() > MAX_DIMS:
        raise ValueError(f"pipeline activations have at most {MAX_DIMS} dimensions, got shape {tuple(tensor.shape)}.")
    if tensor.dtype not in _CODE:
        raise TypeError(f"pipeline activations of dtype {tensor.dtype} are not supported.")
    head = torch.zeros(MAX_DIMS + 2, dtype=torch.int64)
    head[0], head[1] = tensor.dim(), _CODE[tensor.dtype]
    head[2:2 + tensor.dim()] = torch.tensor(tensor.shape, dtype=torch.int64)
    return head


def parse_header(head: torch.Tensor) -> tuple[torch.Size, torch.dtype]:
    ndim, code = int(head[0]), int(head[1])
    return torch.Size(int(v) for v in head[2:2 + ndim]), _DTYPES[code]


def compressed_rank(like: torch.Size | tuple[int, ...], rank: int) -> tuple[int, int, int]:
    """``(n, m, r)``: the matrix view ``[prod(leading), last]`` of a tensor shape and the rank used."""
    m = like[-1] if len(like) else 1
    n = 1
    for d in like[:-1]:
        n *= d
    return n, m, min(n, m, rank)


class StageLink:
    """Sends and receives of one stage, booked in ``comm``'s ledger.

    Args:
        comm: the booked communicator.
        device: where received tensors are put (the stage's device).
    """

    def __init__(self, comm: Communicator, device: torch.device) -> None:
        self.comm, self.device = comm, device
        self.pending: list[BookedWork] = []

    def send_activation(self, tensor: torch.Tensor, dst: int) -> None:
        tensor = tensor.detach().contiguous()
        self.pending.append(self.comm.isend(header_of(tensor).to(tensor.device), dst, "activation"))
        self.pending.append(self.comm.isend(tensor, dst, "activation"))

    def recv_activation(self, src: int) -> torch.Tensor:
        head = self.comm.recv(torch.zeros(MAX_DIMS + 2, dtype=torch.int64, device=self.device), src, "activation")
        shape, dtype = parse_header(head.cpu())
        return self.comm.recv(torch.empty(shape, dtype=dtype, device=self.device), src, "activation")

    def send_grad(self, grad: torch.Tensor, dst: int, compressor: LowRankCompressor | None = None,
                  stream=None) -> None:
        """Sends ``grad`` whole, or as ``P, Q`` from ``compressor`` (its residual kept in ``stream``)
        where the factors are smaller than ``grad`` (otherwise whole: a stream's residual only ever
        has a shape whose factors pay, so none is held back)."""
        if compressor is None or not compressor.pays(grad.shape):
            self.pending.append(self.comm.isend(grad.detach().contiguous(), dst, "activation_grad"))
            return
        p, q = compressor.compress(grad, stream)
        self.pending.append(self.comm.isend(p.contiguous(), dst, "activation_grad"))
        self.pending.append(self.comm.isend(q.contiguous(), dst, "activation_grad"))

    def recv_grad(self, like: torch.Tensor, src: int, rank: int | None = None) -> torch.Tensor:
        """The gradient of ``like``; ``rank`` set: it arrives as rank-``rank`` factors where they are
        smaller than ``like`` (:func:`low_rank_pays`, the sender's rule), whole otherwise."""
        if rank is None or not low_rank_pays(like.shape, rank):
            return self.comm.recv(torch.empty_like(like), src, "activation_grad")
        n, m, r = compressed_rank(like.shape, rank)
        p = self.comm.recv(torch.empty(n, r, device=self.device), src, "activation_grad")
        q = self.comm.recv(torch.empty(m, r, device=self.device), src, "activation_grad")
        return LowRankCompressor.decompress(p, q, like)

    def wait(self) -> None:
        """Completes (and books) every send still in flight."""
        for work in self.pending:
            work.wait()
        self.pending.clear()
