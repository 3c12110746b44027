"""The PowerSGD-style compressor: exactness on low-rank input, error feedback, warm start."""

import pytest
import torch

from lightning_granndis.compression import LowRankCompressor


def test_exact_for_rank_deficient_input():
    g = torch.Generator().manual_seed(0)
    m = torch.randn(6, 4, 3, generator=g) @ torch.randn(3, 32, generator=g)  # rank 3, viewed [24, 32]
    c = LowRankCompressor(rank=4, error_feedback=False)
    p, q = c.compress(m)
    assert p.shape == (24, 4) and q.shape == (32, 4)
    assert torch.allclose(c.decompress(p, q, m), m, atol=1e-4)


def test_error_feedback_preserves_the_sum():
    g = torch.Generator().manual_seed(1)
    c = LowRankCompressor(rank=2)
    grads = [torch.randn(16, 12, generator=g) for _ in range(5)]
    sent = sum(c.decompress(*c.compress(x, stream="b0"), x) for x in grads)
    assert torch.allclose(sent + c.residual("b0"), sum(grads), atol=1e-4)
    assert c.residual("b1") is None  # streams are independent


def test_warm_start_converges_on_a_fixed_matrix():
    g = torch.Generator().manual_seed(2)
    u, _ = torch.linalg.qr(torch.randn(40, 40, generator=g))
    m = u[:, :20] @ torch.diag(torch.logspace(0, -2, 20)) @ u[:, 20:40].T  # decaying spectrum
    c = LowRankCompressor(rank=3, error_feedback=False)
    errors = [float((c.decompress(*c.compress(m), m) - m).norm()) for _ in range(6)]
    best = float(torch.linalg.svdvals(m)[3:].norm())  # optimal rank-3 error
    assert errors[-1] < errors[0] and errors[-1] < 1.05 * best


def test_rank_is_capped_and_validated():
    c = LowRankCompressor(rank=16)
    p, q = c.compress(torch.randn(5, 3))
    assert p.shape == (5, 3) and q.shape == (3, 3)
    with pytest.raises(ValueError, match="rank must be at least 1"):
        LowRankCompressor(rank=0)
