"""Exact resume of an ordinary training script (tests/scripts/user_train.py: BatchNorm, dropout,
Adam + a per-step schedule, gradient accumulation, a shuffled loader, validation watched by a
best-2 ``ResumableCheckpoint(monitor="val_loss")`` and ``EarlyStopping``): resumed from *every*
resume set an uninterrupted run wrote (mid-epoch, an epoch's last step, around a validation), each
run ends with the uninterrupted run's parameters, validation history (every validation, at the same
steps, with the same metrics), best-k scores and EarlyStopping state. One process each (a
subprocess; the torchrun kills are in test_fault_tolerance), and a user's PyG GCN under granndis
CoB on 4 ranks."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from helpers import REPO, SCRIPTS, child_env, torchrun_cmd
from lightning_granndis import random_state
from lightning_granndis.strategies.resumable_loader import resumable


def sweep(tmp_path, ranks: int = 1, **settings) -> dict[str, list[str]]:
    cmd = ([sys.executable, str(SCRIPTS / "user_train.py")] if ranks == 1
           else torchrun_cmd("user_train.py", ranks))
    proc = subprocess.run([*cmd, str(tmp_path), "sweep"],
                          capture_output=True, text=True, timeout=600, cwd=REPO,
                          env=child_env(USER_RUN=json.dumps(settings)))
    assert proc.returncode == 0, proc.stderr[-6000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


@pytest.mark.parametrize("settings", [
    # validation every epoch, a resume set every step (those due on an epoch's last step wait for
    # its validation and end), DataLoader workers and the default sanity check
    {"num_workers": 2},
    {"num_workers": 0},
    # persistent workers, in training and in validation (their generators carry over)
    {"num_workers": 2, "persistent_workers": True},
    # validation inside the epoch, cut short, without accumulation
    # (12 steps an epoch: validations after steps 5, 10, 12 and 17)
    {"accumulate": 1, "steps": 18, "val_check_interval": 5, "limit_val_batches": 2, "num_workers": 2},
    # resume sets every epoch only
    {"every_n_train_steps": None, "every_n_epochs": 1, "steps": 26},
], ids=["workers", "no-workers", "persistent-workers", "val-inside-epoch", "every-epoch"])
def test_resuming_from_every_set_ends_as_the_uninterrupted_run(tmp_path, settings):
    result = sweep(tmp_path, **settings)
    assert len(result) >= 4  # sets at every kind of point were written and resumed
    assert {name: problems for name, problems in result.items() if problems} == {}


def test_a_user_gcn_under_granndis_resumes_from_every_set_as_the_uninterrupted_run(tmp_path):
    """PyG's GCNConv + BatchNorm + dropout, a per-step schedule, accumulation 2, Cooperative
    Batching on 2 servers x 2 ranks with co-batches drawn afresh every epoch, the strategy's exact
    validation every epoch watched by a best-2 ``ResumableCheckpoint(monitor="val_acc")`` and
    EarlyStopping. (Reading the evaluation graph drew an iterator seed from the global generator
    after a resumed run had put its generators back: it ended up to 0.07 off.)"""
    result = sweep(tmp_path, ranks=4, family="gnn", devices=4, servers=2, steps=6, accumulate=2,
                   monitor="val_acc", mode="max")
    assert len(result) >= 4
    assert {name: problems for name, problems in result.items() if problems} == {}


class Noisy(Dataset):
    """Rows whose every read draws from the reading process's generators (augmentation)."""

    def __len__(self):
        return 12

    def __getitem__(self, i):
        import numpy as np

        return torch.tensor([i + 1e-3 * float(torch.rand(())) + 1e-3 * float(np.random.rand())])


def seed_worker(worker_id):
    import numpy as np

    np.random.seed(torch.initial_seed() % 2 ** 32)


def make(sampler: str, workers: int, persistent: bool):
    data = Noisy()
    if sampler == "distributed":
        return resumable(DataLoader(data, batch_size=2, sampler=DistributedSampler(data, num_replicas=1, rank=0),
                                    num_workers=workers, worker_init_fn=seed_worker, persistent_workers=persistent))
    return resumable(DataLoader(data, batch_size=2, shuffle=True, num_workers=workers, worker_init_fn=seed_worker,
                                persistent_workers=persistent))


def epoch(loader, number):
    if hasattr(loader.sampler, "set_epoch"):
        loader.sampler.set_epoch(number)
    return list(loader)


@pytest.mark.parametrize("sampler", ["random", "distributed"])
@pytest.mark.parametrize("workers, persistent", [(0, False), (2, False), (2, True)])
@pytest.mark.parametrize("cut", [3, 6], ids=["mid-epoch", "epoch-end"])
def test_a_resumed_loader_continues_as_the_uninterrupted_one(sampler, workers, persistent, cut):
    """Stopped after ``cut`` of 6 batches and resumed as Lightning does (the loader made, its state
    and the generators put back): the rest of the epoch, the next two epochs (their order, the
    rows' augmentation drawn in the workers) and the main process's generators afterwards match."""
    torch.manual_seed(0)
    loader = make(sampler, workers, persistent)
    if hasattr(loader.sampler, "set_epoch"):
        loader.sampler.set_epoch(0)
    iterator = iter(loader)
    for _ in range(cut):
        next(iterator)
    state, generators = loader.state_dict(), random_state.capture()
    rest = list(iterator)
    later = [epoch(loader, 1), epoch(loader, 2)]
    after = torch.rand(3)

    torch.manual_seed(0)
    resumed = make(sampler, workers, persistent)
    if hasattr(resumed.sampler, "set_epoch"):
        resumed.sampler.set_epoch(0 if cut < 6 else 1)
    resumed.load_state_dict(state)
    random_state.restore(generators)
    resumed_rest = list(resumed) if cut < 6 else []
    resumed_later = [epoch(resumed, 1), epoch(resumed, 2)]

    def same(a, b):
        return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))

    assert same(rest, resumed_rest)
    assert all(same(a, b) for a, b in zip(later, resumed_later))
    assert torch.equal(after, torch.rand(3))
