"""server_aware_ddp against Lightning's DDP on 4 real processes (torchrun, gloo), 2 virtual servers."""

import csv
import json

import pytest
import torch

from helpers import read_ranks, torchrun

STEPS = 6
WORLD = 4


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp")
    torchrun("train_mlp.py", WORLD, str(out), str(STEPS))
    return out


def inter_bytes(records):
    return sum(r["ledger"].get("inter/grad_sync", {}).get("bytes", 0) for r in records)


@pytest.mark.parametrize("variant", ["hier", "flat"])
def test_parameters_equal_plain_ddp(run_dir, variant):
    ref = torch.load(run_dir / "ddp" / "params.pt", weights_only=True)
    got = torch.load(run_dir / variant / "params.pt", weights_only=True)
    assert ref.keys() == got.keys()
    for key in ref:
        torch.testing.assert_close(got[key], ref[key], rtol=0, atol=1e-6)


def test_hierarchical_sync_cuts_inter_server_bytes_by_devices_per_server(run_dir):
    flat, hier = read_ranks(run_dir / "flat", WORLD), read_ranks(run_dir / "hier", WORLD)
    grad_bytes = flat[0]["params"] * 4
    assert flat[0]["steps"] == STEPS and flat[0]["servers"] == 2
    # pairwise all-reduce over 2 servers x 2 devices: 2(N-1)G * S across servers per step
    assert inter_bytes(flat) == 2 * 1 * 2 * grad_bytes * STEPS
    assert inter_bytes(hier) == 2 * 1 * 1 * grad_bytes * STEPS
    assert inter_bytes(flat) == 2 * inter_bytes(hier)
    # only the server heads (ranks 0 and 2) cross servers
    assert [("inter/grad_sync" in r["ledger"]) for r in hier] == [True, False, True, False]


def test_comm_monitor_logs_prints_and_plots(run_dir):
    hier = read_ranks(run_dir / "hier", WORLD)
    summary = json.loads((run_dir / "hier" / "comm_breakdown.json").read_text())
    assert summary["ranks"] == WORLD and summary["emulated"] is False
    assert summary["total"]["inter/grad_sync"]["bytes"] == inter_bytes(hier)
    assert "| inter | grad_sync |" in summary["table"]
    png = (run_dir / "hier" / "comm_breakdown.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    with open(run_dir / "hier" / "version_0" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    epoch = [float(r["comm_epoch/inter/grad_sync/bytes"]) for r in rows if r.get("comm_epoch/inter/grad_sync/bytes")]
    assert epoch == [inter_bytes(hier)]
    step = [float(r["comm_step/inter/grad_sync/bytes"]) for r in rows if r.get("comm_step/inter/grad_sync/bytes")]
    assert len(step) == STEPS // 2 and sum(step) <= inter_bytes(hier)
    assert all(s == 2 * 2 * hier[0]["params"] * 4 for s in step)  # 2 steps per log x 2S


def test_training_moved_the_parameters(run_dir):
    import lightning.pytorch as pl

    from lightning_granndis.models import MLPClassifier

    pl.seed_everything(0)
    initial = MLPClassifier(hidden=[64, 64], dropout=0.0).state_dict()
    trained = torch.load(run_dir / "hier" / "params.pt", weights_only=True)
    assert max((trained[k] - initial[k]).abs().max().item() for k in initial) > 1e-3
