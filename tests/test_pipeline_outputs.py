"""The last block's outputs under the pipeline: metrics on every rank (logged, monitored by
ModelCheckpoint and EarlyStopping, torchmetrics), ``self(x)`` in validation, ``trainer.predict``."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch

from helpers import REPO, SCRIPTS, child_env, torchrun, torchrun_cmd
from lightning_granndis.pipeline import consolidate_checkpoint


def test_output_metrics_reach_every_rank_and_predict_returns_the_outputs(tmp_path):
    torchrun("pipeline_outputs.py", 4, str(tmp_path), timeout=300)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    for key in ("val_acc", "train_acc", "best", "best_score"):
        assert len({r[key] for r in ranks}) == 1, key  # the same on every rank, rank 0 included
    assert 0.0 <= ranks[0]["val_acc"] <= 1.0 and ranks[0]["best_score"] >= ranks[0]["val_acc"] - 1e-6
    assert ranks[0]["best"].endswith(".ckpt") and (tmp_path / "ckpt").is_dir()
    # predictions: each replica's rows (the predict sampler gives replica r rows r, r + 2, ...),
    # equal to one device's forward with the trained weights
    import sys

    sys.path.insert(0, str(SCRIPTS))
    state = consolidate_checkpoint(tmp_path / "final.ckpt")
    from torch import nn

    whole = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Linear(16, 3))
    whole.load_state_dict({k.removeprefix("blocks."): v for k, v in state.items() if k.startswith("blocks.")})
    g = torch.Generator().manual_seed(0)
    X = torch.randn(64, 6, generator=g)
    with torch.no_grad():
        want = whole(X[:16])
    for r in ranks:
        got = torch.tensor(r["predictions"])
        assert got.shape == (8, 3)
        assert torch.allclose(got, want[r["replica"]::2], atol=1e-6), r["replica"]


def test_logging_inside_pipeline_loss_is_refused_with_the_fix_on_every_rank(tmp_path):
    proc = subprocess.run(torchrun_cmd("pipeline_outputs.py", 4, str(tmp_path), "log_in_loss"), capture_output=True,
                          text=True, timeout=300, env=child_env(), cwd=REPO)
    assert proc.returncode != 0
    assert "inside pipeline_loss" in proc.stderr and "return_outputs=True" in proc.stderr
