"""The granndis console script on the demo recipe (4 processes, 2 virtual servers, emulated 10 GbE)."""

import json

import torch

from helpers import REPO, run

GRANNDIS = str(REPO / ".venv" / "bin" / "granndis")


def test_demo_recipe_fits_prints_summary_and_validates_from_checkpoint(tmp_path):
    overrides = [
        "--trainer.max_epochs=2", f"--trainer.default_root_dir={tmp_path}",
        "--trainer.logger=lightning.pytorch.loggers.CSVLogger", f"--trainer.logger.save_dir={tmp_path}",
        "--trainer.enable_progress_bar=false",
    ]
    proc = run([GRANNDIS, "fit", "--config", "recipes/demo.yaml", *overrides])
    out = proc.stdout
    assert "== fit summary ==" in out and "epochs: 2" in out
    assert "ServerAwareDDPStrategy on 2 virtual servers x 2 devices (4 ranks)" in out
    assert "Communication breakdown" in out and "[emulated]" in out
    val_acc = float(out.split("val_acc:")[1].split()[0])
    assert 0.5 < val_acc < 1.0
    summary = json.loads(next(tmp_path.rglob("comm_breakdown.json")).read_text())
    assert summary["emulated"] and summary["total"]["inter/grad_sync"]["bytes"] > 0
    ckpt = next(tmp_path.rglob("last.ckpt"))
    state = torch.load(ckpt, weights_only=True)  # a plain weights-only load works
    assert "state_dict" in state and state["epoch"] == 1
    assert (tmp_path / "config.yaml").exists() or list(tmp_path.rglob("config.yaml"))
    proc = run([GRANNDIS, "validate", "--config", "recipes/demo.yaml", *overrides, f"--ckpt_path={ckpt}"])
    assert "== validate summary ==" in proc.stdout
    assert abs(float(proc.stdout.split("val_acc:")[1].split()[0]) - val_acc) < 0.05
