"""settle_epoch_end: a checkpoint taken as an epoch ends resumes at the next epoch's start, so a
run resumed twice (from a checkpoint that a resumed run wrote) sees the uninterrupted run's batches,
epochs and hooks. Plain Lightning (one process) with the rewrite applied on load, as our strategies
apply it in ``load_checkpoint``."""

from __future__ import annotations

import copy

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from lightning_granndis.strategies.loop_state import settle_epoch_end

pytestmark = pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty")

ROWS = 4  # an epoch is 4 steps (batches of one row)


class Recorder(pl.LightningModule):
    """Records (epoch, step, rows) per batch and each on_train_epoch_start."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.seen: list = []

    def training_step(self, batch, batch_idx):
        self.seen.append(("batch", self.trainer.current_epoch, self.global_step, batch[0][:, 0].tolist()))
        return self.layer(batch[0]).sum()

    def on_train_epoch_start(self):
        self.seen.append(("epoch_start", self.trainer.current_epoch))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        # shuffled by epoch (set_epoch), as Lightning's distributed sampler does
        data = TensorDataset(torch.arange(2.0 * ROWS).view(ROWS, 2))
        return DataLoader(data, batch_size=1, sampler=DistributedSampler(data, num_replicas=1, rank=0, seed=3))


class Settle(pl.Callback):
    def on_load_checkpoint(self, trainer, pl_module, checkpoint):
        settle_epoch_end(checkpoint)


def fit(max_steps, dirpath, save, resume=None, settle=True):
    pl.seed_everything(0)
    if save == "batch":  # every_n_train_steps lands on each epoch's last batch
        saver = ModelCheckpoint(dirpath, filename="{step}", every_n_train_steps=1, save_top_k=-1)
    else:
        saver = ModelCheckpoint(dirpath, filename="{step}", every_n_epochs=1, save_top_k=-1, save_on_train_epoch_end=True)
    module = Recorder()
    trainer = pl.Trainer(accelerator="cpu", max_steps=max_steps, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, use_distributed_sampler=False,
                         callbacks=[saver] + ([Settle()] if settle else []))
    trainer.fit(module, ckpt_path=resume)
    return module.seen


def batches(seen, after=-1):
    return [s for s in seen if s[0] == "batch" and s[2] > after]


@pytest.mark.parametrize("save", ["batch", "epoch"])
def test_a_run_resumed_twice_from_epoch_end_checkpoints_equals_the_uninterrupted_run(tmp_path, save):
    reference = fit(3 * ROWS + 2, tmp_path / "ref", save)
    # resume from the end of epoch 0 (step 4), then from the end of epoch 1 as the resumed run saved it
    first = fit(2 * ROWS + 1, tmp_path / "resumed", save, resume=tmp_path / "ref" / f"step={ROWS}.ckpt")
    second = fit(3 * ROWS + 2, tmp_path / "resumed", save, resume=tmp_path / "resumed" / f"step={2 * ROWS}.ckpt")
    assert batches(first, after=-1)[: ROWS] + batches(second) == batches(reference, after=ROWS - 1)
    # every epoch that starts after a resume runs its on_train_epoch_start hooks
    assert [s for s in first if s[0] == "epoch_start"][:1] == [("epoch_start", 1)]
    assert [s for s in second if s[0] == "epoch_start"] == [("epoch_start", 2), ("epoch_start", 3)]
    # the resumed run's checkpoint records what the uninterrupted run's does
    ours = torch.load(tmp_path / "resumed" / f"step={2 * ROWS}.ckpt", weights_only=True)["loops"]
    theirs = torch.load(tmp_path / "ref" / f"step={2 * ROWS}.ckpt", weights_only=True)["loops"]
    assert ours["fit_loop"]["epoch_progress"] == theirs["fit_loop"]["epoch_progress"]
    assert ours["fit_loop"]["epoch_loop.state_dict"] == theirs["fit_loop"]["epoch_loop.state_dict"]


def test_without_the_rewrite_lightning_replays_an_epoch(tmp_path):
    """What the rewrite mends (Lightning 2.6): the second resume shuffles with the wrong epoch."""
    reference = fit(3 * ROWS, tmp_path / "ref", "batch", settle=False)
    fit(2 * ROWS + 1, tmp_path / "resumed", "batch", resume=tmp_path / "ref" / f"step={ROWS}.ckpt", settle=False)
    second = fit(3 * ROWS, tmp_path / "resumed", "batch", resume=tmp_path / "resumed" / f"step={2 * ROWS}.ckpt",
                 settle=False)
    assert batches(second) != batches(reference, after=2 * ROWS - 1)


def test_mid_epoch_and_foreign_checkpoints_are_left_alone(tmp_path):
    fit(ROWS + 2, tmp_path, "batch", settle=False)
    mid = torch.load(tmp_path / f"step={ROWS + 2}.ckpt", weights_only=True)
    before = copy.deepcopy(mid)
    assert not settle_epoch_end(mid) and mid["loops"] == before["loops"]
    end = torch.load(tmp_path / f"step={ROWS}.ckpt", weights_only=True)
    assert settle_epoch_end(end)
    progress = end["loops"]["fit_loop"]["epoch_progress"]["total"]
    assert set(progress.values()) == {1}  # epoch 0 finished, epoch 1 not begun
    assert not settle_epoch_end({"state_dict": {}}) and not settle_epoch_end({"loops": {}})
