"""AdaQP-style stochastic quantisation: packing, error bound, unbiasedness."""

import pytest
import torch

from lightning_granndis.graph.quantise import dequantise, quantise


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("width", [1, 7, 16])
def test_round_trip_within_one_level(bits, width):
    x = torch.randn(50, width) * 3
    packed, params = quantise(x, bits, torch.Generator().manual_seed(0))
    assert packed.dtype == torch.uint8 and packed.shape == (50, -(-width // (8 // bits)))
    x_hat = dequantise(packed, params, bits, width)
    level = (x.max(1).values - x.min(1).values) / (2**bits - 1)
    assert ((x_hat - x).abs() <= level[:, None] + 1e-5).all()


def test_unbiased():
    x = torch.randn(4, 8)
    g = torch.Generator().manual_seed(1)
    mean = sum(dequantise(*quantise(x, 2, g), 2, 8) for _ in range(4000)) / 4000
    level = float((x.max(1).values - x.min(1).values).max() / 3)
    assert (mean - x).abs().max() < 0.05 * level


def test_constant_rows_and_bad_bits():
    x = torch.full((3, 5), 2.5)
    assert torch.allclose(dequantise(*quantise(x, 4), 4, 5), x)
    with pytest.raises(ValueError, match="bits must be one of"):
        quantise(x, 3)
