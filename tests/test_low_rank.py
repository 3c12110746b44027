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


def test_low_rank_pays_only_when_the_factors_are_smaller():
    from lightning_granndis.compression.low_rank import low_rank_pays

    assert not low_rank_pays((16, 64), 16)  # 16 * (16 + 64) = 1280 numbers > 1024
    assert low_rank_pays((128, 64), 16)  # 16 * 192 = 3072 < 8192
    assert low_rank_pays((4, 8, 64), 16)  # viewed [32, 64]: 16 * 96 = 1536 < 2048
    assert not low_rank_pays((4, 8, 64), 32)  # 32 * 96 = 3072 > 2048
    assert low_rank_pays((4, 8, 64), 8)  # 8 * 96 = 768 < 2048
    assert not low_rank_pays((1000,), 4)  # a vector [1000, 1]: rank 1, 1001 > 1000


class _Loopback:
    """A communicator whose sends arrive, in order, at its own receives."""

    def __init__(self):
        self.sent = []

    def isend(self, tensor, dst, purpose):
        self.sent.append(tensor.clone())
        return type("Work", (), {"wait": lambda self: None})()

    def recv(self, buffer, src, purpose):
        return buffer.copy_(self.sent.pop(0))


@pytest.mark.parametrize("rows, compressed", [(16, False), (128, True)])
def test_a_gradient_whose_factors_would_be_larger_travels_whole(rows, compressed):
    from lightning_granndis.pipeline.p2p import StageLink

    comm = _Loopback()
    link = StageLink(comm, torch.device("cpu"))
    c = LowRankCompressor(rank=16)
    grad = torch.randn(rows, 64, generator=torch.Generator().manual_seed(rows))
    link.send_grad(grad, 1, c, stream="b0")
    sent_bytes = sum(t.numel() * t.element_size() for t in comm.sent)
    got = link.recv_grad(torch.empty(rows, 64), 0, rank=16)
    assert not comm.sent  # the receiver took exactly what was sent
    if compressed:
        assert sent_bytes == (rows + 64) * 16 * 4
        assert torch.allclose(got + c.residual("b0"), grad, atol=1e-5)
    else:
        assert sent_bytes == rows * 64 * 4  # never more than the plain gradient
        assert torch.equal(got, grad) and c.residual("b0") is None
