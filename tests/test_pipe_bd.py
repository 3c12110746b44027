"""Pipe-BD and its baselines in real 4-process gloo runs, against one-process blockwise distillation."""

from __future__ import annotations

import sys

import lightning.pytorch as pl
import pytest
import torch

from helpers import SCRIPTS, torchrun

sys.path.insert(0, str(SCRIPTS))
from distill_toy import ToyData, ToyDistillation  # noqa: E402

# name: mode, schedule, dp widths, DPU
RUNS = {
    "tr": "tr:even:-:0",            # teacher relaying, a stage per rank, barrier before each step
    "tr_dpu_3x1": "tr:0,1/2,3:3,1:1",  # a 3-wide first stage: 10-row batches split 3/3/4, the 2-row one 0/1/1
    "tr_dpu_2x2": "tr:0/1,2,3:2,2:1",
    "auto": "tr:auto:-:1",          # AHD: whatever it chooses, the maths is the same
    "dna": "dna:even:-:1",
    "ls": "ls:even:-:1",
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("pipe_bd")
    torchrun("pipe_bd_train.py", 4, str(out), *[f"{name}:{spec}" for name, spec in RUNS.items()],
             f"resume:{RUNS['tr_dpu_3x1']}", f"lightning_sampler:{RUNS['tr_dpu_2x2']}", timeout=500)
    loaded = {name: torch.load(out / f"{name}.pt", weights_only=True)
              for name in [*RUNS, "ckpt_full", "ckpt_resumed", "lightning_sampler"]}
    loaded["ckpt_dir"] = out / "ckpt"
    loaded["ckpt_other"] = (out / "ckpt_other.txt").read_text()
    return loaded


@pytest.fixture(scope="module")
def reference():
    model = ToyDistillation()
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=2, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(model, datamodule=ToyData())
    return {"student": model.assemble_student().state_dict(),
            "metrics": {k: float(v) for k, v in trainer.callback_metrics.items()},
            "execs": model.distill_runner().teacher_execs_per_batch()}


def test_with_lightnings_shuffling_sampler_it_equals_one_process_given_that_order(runs, reference):
    """Lightning gives a multi-process run a shuffling DistributedSampler even for shuffle=False;
    the one-process run reproduces it with the README's one line (ToyDataInLightningsOrder)."""
    from distill_toy import ToyDataInLightningsOrder

    model = ToyDistillation()
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=2, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(model, datamodule=ToyDataInLightningsOrder(seed=5))
    want, got = model.assemble_student().state_dict(), runs["lightning_sampler"]["student"]
    for key in want:
        assert torch.allclose(got[key], want[key], rtol=1e-4, atol=2e-5), key
    # and the DataLoader's own order is another run: the difference a user would see
    assert max((got[k] - reference["student"][k]).abs().max() for k in want) > 1e-3


@pytest.mark.parametrize("name", list(RUNS))
def test_student_blocks_equal_one_process_blockwise_distillation(runs, reference, name):
    # 8 AdamW steps (2 epochs of 4 batches, the last of 2 rows) on every block.
    got = runs[name]["student"]
    for key, want in reference["student"].items():
        assert torch.allclose(got[key], want, rtol=1e-4, atol=2e-5), (name, key, (got[key] - want).abs().max())
    # the student moved: the comparison is not between two untouched initialisations
    assert (reference["student"]["0.0.weight"] - ToyDistillation().student[0][0].weight).abs().max() > 1e-3


@pytest.mark.parametrize("name", list(RUNS))
def test_validation_of_the_assembled_student_equals_one_process(runs, reference, name):
    got, want = runs[name]["metrics"], reference["metrics"]
    for key in ("val_loss", "val_block0_loss", "val_block3_loss", "val_student_acc", "val_teacher_acc",
                "train_blocks_loss"):
        assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), (name, key)


def test_teacher_runs_each_block_once_per_batch_per_stage_against_n_n_plus_1_over_2_for_dna(runs, reference):
    n = 4
    assert reference["execs"] == n
    per_rank = {name: runs[name]["report"]["teacher_execs_per_batch"] for name in RUNS}
    # Teacher relaying: every rank runs exactly its own blocks once per batch in which it holds rows
    # (batches of 10, 10, 10, 2 rows: with 3 ranks on a stage, the first holds none of the 2-row one).
    from lightning_granndis.distill import row_range

    batches = [10, 10, 10, 2]
    for name in ("tr", "tr_dpu_3x1", "tr_dpu_2x2", "auto"):
        stages = runs[name]["schedule"]["stages"]
        widths = runs[name]["schedule"]["widths"]
        want = [len(s) * sum(1 for b in batches if row_range(b, w, j)[1] > row_range(b, w, j)[0]) / len(batches)
                for s, w in zip(stages, widths) for j in range(w)]
        assert per_rank[name] == want, name
    held = [sum(1 for b in batches if row_range(b, 4, j)[1] > row_range(b, 4, j)[0]) / len(batches) for j in range(4)]
    assert per_rank["dna"] == [n * (n + 1) / 2 * h for h in held]  # every block re-runs the teacher from the input
    assert held == [0.75, 1.0, 0.75, 1.0]
    assert per_rank["ls"] == [1, 2, 3, 4]               # each rank runs the teacher up to its block


def test_auto_schedule_is_reported_with_prediction_and_measurement(runs):
    report = runs["auto"]["report"]
    assert report["predicted_step_s"] > 0 and report["measured_step_s"] > 0
    assert sum(report["schedule"]["widths"]) == 4


def test_resuming_from_a_checkpoint_continues_exactly(runs):
    # every rank's optimizer state and the whole student come back: the resumed second epoch lands
    # exactly where the uninterrupted run did (and checkpointing changed nothing in that run)
    full, resumed, plain = runs["ckpt_full"]["student"], runs["ckpt_resumed"]["student"], runs["tr_dpu_3x1"]["student"]
    for key in full:
        assert torch.equal(full[key], resumed[key]), key
        assert torch.equal(full[key], plain[key]), key


def test_the_checkpoint_is_an_ordinary_whole_model_checkpoint(runs):
    ckpt = torch.load(runs["ckpt_dir"] / "epoch=1-step=8.ckpt", weights_only=True)
    model = ToyDistillation()
    model.load_state_dict(ckpt["state_dict"])  # strict: every block of teacher and student is there
    for key, value in runs["ckpt_full"]["student"].items():
        assert torch.equal(model.student.state_dict()[key], value), key
    assert ckpt["pipe_bd"]["schedule"] == {"stages": [[0, 1], [2, 3]], "widths": [3, 1]}


def test_resuming_with_another_schedule_is_refused_naming_both(runs):
    message = runs["ckpt_other"]
    assert "another Pipe-BD configuration" in message and "[3, 1]" in message and "Resume with the same" in message
