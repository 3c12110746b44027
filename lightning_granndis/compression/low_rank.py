"""Low-rank (PowerSGD-style) compression with warm start and error feedback.

`PowerSGD: Practical Low-Rank Gradient Compression for Distributed Optimization
<https://arxiv.org/abs/1905.13727>`_ (Vogels et al., NeurIPS'19), as Optimus-CC (ASPLOS'23, §4)
applies it to the activation gradients sent between pipeline stages. A tensor is viewed as an
``n x m`` matrix :math:`M` (``n`` = product of the leading dimensions, ``m`` = the last); with the
error buffer :math:`e` (Lazy Error Propagation) and the previous :math:`Q` (warm start):

.. math::
    M' = M + e,\\quad P = \\mathrm{orth}(M' Q),\\quad Q \\leftarrow M'^\\top P,\\quad
    \\hat{M} = P Q^\\top,\\quad e \\leftarrow M' - \\hat{M}

Only ``P`` (``n x r``) and ``Q`` (``m x r``) travel: ``r (n + m)`` numbers instead of ``n m``; where
that is not fewer (:func:`low_rank_pays`), the tensor travels whole.
Because the residual is carried, the sum of everything sent plus the final residual equals the sum
of the true tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


def as_matrix(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` viewed as ``[prod(leading dims), last dim]`` (a ``[n]`` vector as ``[n, 1]``)."""
    if tensor.dim() == 0:
        return tensor.reshape(1, 1)
    if tensor.dim() == 1:
        return tensor.reshape(-1, 1)
    return tensor.reshape(-1, tensor.shape[-1])


def low_rank_pays(shape: torch.Size | tuple[int, ...], rank: int) -> bool:
    """Whether rank-``rank`` factors of a tensor of ``shape`` are smaller than the tensor:
    ``r (n + m) < n m`` for its ``[n, m]`` matrix view (``r = min(n, m, rank)``). Sender and receiver
    decide from the shape alone, so a tensor that would grow travels whole."""
    n, m = as_matrix(torch.empty(shape, device="meta")).shape
    return min(n, m, rank) * (n + m) < n * m


def orthogonalise(matrix: torch.Tensor) -> torch.Tensor:
    """Orthonormal columns spanning ``matrix``'s columns (reduced QR)."""
    q, _ = torch.linalg.qr(matrix.float(), mode="reduced")
    return q.to(matrix.dtype)


@dataclass
class _Stream:
    q: torch.Tensor | None = None
    error: torch.Tensor | None = None


@dataclass
class LowRankCompressor:
    """Rank-``rank`` compression, one power iteration per call, with per-stream state.

    Args:
        rank: target rank ``r`` (default 16); the effective rank is ``min(n, m, r)``.
        error_feedback: keep the residual and add it to the next tensor of the stream (LEP).
        seed: seed of the first random ``Q`` of each stream.

    A *stream* (any hashable key, e.g. a pipeline boundary) keeps its own ``Q`` and residual, so
    they carry over across micro-batches and iterations.
    """

    rank: int = 16
    error_feedback: bool = True
    seed: int = 0
    _streams: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ValueError(f"rank must be at least 1, got {self.rank}.")

    def compress(self, tensor: torch.Tensor, stream=None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(P [n, r], Q [m, r])`` with ``P @ Q.T`` approximating ``tensor`` (plus the carried error)."""
        state = self._streams.setdefault(stream, _Stream())
        matrix = as_matrix(tensor.detach()).float()
        if self.error_feedback and state.error is not None and state.error.shape == matrix.shape:
            matrix = matrix + state.error
        n, m = matrix.shape
        r = min(n, m, self.rank)
        if state.q is None or state.q.shape != (m, r):
            g = torch.Generator(device="cpu").manual_seed(self.seed)
            state.q = torch.randn(m, r, generator=g).to(matrix.device)
        p = orthogonalise(matrix @ orthogonalise(state.q))
        q = matrix.T @ p
        state.q = q
        if self.error_feedback:
            state.error = matrix - p @ q.T
        return p, q

    def pays(self, shape: torch.Size | tuple[int, ...]) -> bool:
        """:func:`low_rank_pays` at this compressor's rank."""
        return low_rank_pays(shape, self.rank)

    @staticmethod
    def decompress(p: torch.Tensor, q: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """``P @ Q.T`` reshaped and cast like ``like``."""
        return (p @ q.T).reshape(like.shape).to(like.dtype)

    def residual(self, stream=None) -> torch.Tensor | None:
        """The error carried by ``stream`` (``None`` before its first call or without feedback)."""
        state = self._streams.get(stream)
        return None if state is None else state.error

    def state_dict(self) -> dict:
        """Every stream's ``Q`` and residual (streams keyed by ``str``), for checkpoints."""
        return {str(k): {"q": v.q, "error": v.error} for k, v in self._streams.items()}

    def load_state_dict(self, state: dict) -> None:
        self._streams = {k: _Stream(q=v["q"], error=v["error"]) for k, v in state.items()}

    def reset(self) -> None:
        self._streams.clear()
