"""The four-way time breakdown from a ledger."""

import pytest

from lightning_granndis.ledger import CommLedger
from lightning_granndis.report import plot_time_breakdown, time_breakdown


def test_time_breakdown_golden(tmp_path):
    ledger = CommLedger()
    ledger.book("intra", "halo", nbytes=10, bytes_received=10, seconds=0.5, modelled_seconds=0.1)
    ledger.book("inter", "halo", nbytes=10, bytes_received=10, seconds=1.5, modelled_seconds=0.1)
    ledger.book("inter", "grad_sync", nbytes=10, bytes_received=10, seconds=0.25, modelled_seconds=0.1)
    ledger.book("intra", "grad_sync", nbytes=10, bytes_received=10, seconds=0.25, modelled_seconds=0.1)
    ledger.book("inter", "eval", nbytes=10, bytes_received=10, seconds=9.0, modelled_seconds=0.1)
    out = time_breakdown(ledger, train_seconds=4.0)
    assert out == pytest.approx({"compute": 1.5, "intra_comm": 0.5, "inter_comm": 1.5, "grad_sync": 0.5, "total": 4.0})
    assert plot_time_breakdown([out, out], tmp_path / "t.png", "x").stat().st_size > 1000
