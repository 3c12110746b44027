"""Surviving faults: a SIGKILLed worker under ``torchrun --max-restarts`` resumes from the newest
complete checkpoint set and ends where an uninterrupted run ends; broken sets are named and
skipped; a set is committed only once all its files are written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import REPO, SCRIPTS, child_env, free_port
from lightning_granndis import checkpoint_sets
from lightning_granndis.checkpoint_sets import CheckpointSetError, commit_set, newest_complete, verify_set


def launch(family: str, out: Path, kill_step: int = -1, kill_rank: int = 1, slow_save: float = 0.0,
           how: str = "kill", timeout: float = 420, plan: list[dict] | None = None,
           steps: int = 8, every: int = 2, snapshots: bool = False) -> subprocess.CompletedProcess:
    """One torchrun launch of tests/scripts/fault_train.py: one fault (``kill_step``...), or with
    ``plan`` one fault per attempt (disk checkpoints every ``every`` steps, ``steps`` steps, with
    ``snapshots`` a ReplicaSnapshot every step)."""
    env = child_env()
    if plan is not None:
        env.update(plan_env(plan, steps, every, snapshots))
    restarts_allowed = max(2, len(plan or []))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=4", f"--max-restarts={restarts_allowed}",
           "--monitor-interval=0.5", "--master-addr=127.0.0.1", f"--master-port={free_port()}",
           str(SCRIPTS / "fault_train.py"), family, str(out), str(kill_step), str(kill_rank), str(slow_save), how]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc


def plan_env(plan: list[dict], steps: int, every: int, snapshots: bool) -> dict[str, str]:
    return {"FAULT_PLAN": json.dumps(plan), "FAULT_STEPS": str(steps), "FAULT_EVERY": str(every),
            "FAULT_SNAPSHOTS": str(int(snapshots))}


def launch_without_torchrun(out: Path, steps: int, timeout: float = 300) -> list[subprocess.CompletedProcess]:
    """The ddp worker's 4 ranks started by hand, as a cluster scheduler (or Lightning's own
    launcher) starts them: the process group is the first store the ranks share."""
    port, ranks = free_port(), []
    for rank in range(4):
        env = child_env(RANK=str(rank), LOCAL_RANK=str(rank), GROUP_RANK="0", WORLD_SIZE="4", LOCAL_WORLD_SIZE="4",
                        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                        **plan_env([], steps, every=4, snapshots=True))
        for key in ("TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RUN_ID"):
            env.pop(key, None)
        ranks.append(subprocess.Popen([sys.executable, str(SCRIPTS / "fault_train.py"), "ddp", str(out)], env=env,
                                      cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    done = []
    for rank, proc in enumerate(ranks):
        stdout, stderr = proc.communicate(timeout=timeout)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
    return done


def restarts(out: Path) -> int:
    return max(int(p.name.split(".")[0]) for p in (out / "attempts").iterdir())


def finals(out: Path, family: str) -> list[dict]:
    if family == "pipeline":
        return [torch.load(out / f"final.{r}.pt") for r in range(4)]
    return [torch.load(out / "final.pt")]


def assert_same_parameters(mine: list[dict], theirs: list[dict]) -> None:
    """Each rank's (or the run's) final parameters equal the reference run's."""
    assert len(mine) == len(theirs)
    for state, reference in zip(mine, theirs):
        assert state.keys() == reference.keys()
        for key in state:
            assert torch.allclose(state[key].float(), reference[key].float(), atol=1e-6), key


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    runs = {}
    base = tmp_path_factory.mktemp("uninterrupted")
    for family in ("ddp", "gnn", "pipeline", "pipe_bd"):
        launch(family, base / family)
        runs[family] = finals(base / family, family)
    return runs


@pytest.mark.parametrize("family", ["ddp", "gnn", "pipeline", "pipe_bd"])
def test_a_killed_worker_resumes_and_ends_as_the_uninterrupted_run(tmp_path, uninterrupted, family):
    # killed after step 7 (epochs of 4 steps): the run resumes mid-epoch from its step-6
    # checkpoint and redoes step 7, with the batches, samples and random numbers it had
    launch(family, tmp_path, kill_step=7, kill_rank=1)
    assert restarts(tmp_path) == 1
    assert "step=6.ckpt" in (tmp_path / "resumed_from").read_text()
    assert all((tmp_path / f"steps.{r}").read_text() == "8" for r in range(4))
    assert_same_parameters(finals(tmp_path, family), uninterrupted[family])


def test_repeated_kills_resume_from_checkpoints_that_resumed_runs_wrote(tmp_path, uninterrupted):
    """Three kills in one job (rank 1, rank 0, rank 2), each resumed from a checkpoint the previous
    attempt wrote: mid-epoch (step 2), at an epoch's end (step 4, written by the attempt that
    resumed from step 2; Lightning miscounted such epochs before), mid-epoch again (step 6); the
    job ends as the uninterrupted 8-step run."""
    plan = [{"kind": "kill", "step": 3, "rank": 1}, {"kind": "kill", "step": 5, "rank": 0},
            {"kind": "kill", "step": 7, "rank": 2}]
    launch("ddp", tmp_path, plan=plan, steps=8, every=2, timeout=600)
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [e["resumed_step"] for e in events if e["event"] == "first_step"] == [0, 2, 4, 6]
    assert restarts(tmp_path) == 3
    assert_same_parameters(finals(tmp_path, "ddp"), uninterrupted["ddp"])


def test_a_kill_while_a_set_is_written_resumes_from_the_previous_set(tmp_path, uninterrupted):
    # every checkpoint file takes 1 s to write; rank 0 (stage 0's writer and the committer) dies
    # once its step-6 shard is written, before the set is committed: the step-4 set is resumed
    launch("pipeline", tmp_path, kill_step=6, kill_rank=0, slow_save=1.0)
    assert restarts(tmp_path) == 1
    assert "step=4.ckpt" in (tmp_path / "resumed_from").read_text()
    assert_same_parameters(finals(tmp_path, "pipeline"), uninterrupted["pipeline"])


def test_a_stopped_rank_is_named_by_every_peer_and_the_restart_resumes(tmp_path, uninterrupted):
    # rank 1 SIGSTOPped after step 7: its peers' collectives time out (8 s), each names rank 1 as
    # the rank that stopped answering, torchrun restarts the job and it resumes from step 6
    proc = launch("ddp", tmp_path, kill_step=7, kill_rank=1, how="stop")
    assert restarts(tmp_path) == 1
    # every live rank names rank 1, and only rank 1 (not the peers that failed because of it)
    assert proc.stderr.count("rank 1 of 4 stopped answering") == 3, proc.stderr[-6000:]
    assert proc.stderr.count("stopped answering") == 3, proc.stderr[-6000:]
    assert "step=6.ckpt" in (tmp_path / "resumed_from").read_text()
    assert_same_parameters(finals(tmp_path, "ddp"), uninterrupted["ddp"])


@pytest.mark.parametrize("how, kill_step, server0_resumes, server1_resumes", [
    # rank 2 killed after step 3, before the first disk checkpoint (every 4 steps here), and
    # server 1 (ranks 2, 3) loses its memory with it: it holds nothing at all, yet every rank
    # resumes from server 0's step-2 snapshot, which server 1 receives (the disk: from scratch)
    ("replica_lost", 3, "shm/server0/epoch=0-step=2.ckpt", "shm/server1/epoch=0-step=2.ckpt"),
    # rank 2 killed after step 7 and no server keeps a snapshot: the disk checkpoint of step 4
    # (a set due on an epoch's last step is taken once that epoch has ended: named by the next epoch)
    ("replica_none", 7, "checkpoints/resume-epoch=1-step=4.ckpt", "checkpoints/resume-epoch=1-step=4.ckpt"),
])
def test_replica_snapshots_lose_one_step_and_fall_back_to_disk(tmp_path, uninterrupted, how, kill_step,
                                                              server0_resumes, server1_resumes):
    launch("ddp", tmp_path, kill_step=kill_step, kill_rank=2, how=how)  # snapshots every step
    assert restarts(tmp_path) == 1
    resumed = {r: (tmp_path / f"resumed_from.{r}").read_text() for r in range(4)}
    assert all(resumed[r].endswith(server0_resumes) for r in (0, 1)), resumed
    assert all(resumed[r].endswith(server1_resumes) for r in (2, 3)), resumed
    # memory holds one snapshot per server at the end (resumed-from ones and placeholders go)
    for server in ("server0", "server1"):
        if how == "replica_lost":
            assert [p.name for p in (tmp_path / "shm" / server).glob("*.ckpt")] == ["epoch=2-step=8.ckpt"]
    assert_same_parameters(finals(tmp_path, "ddp"), uninterrupted["ddp"])


def test_replica_recovery_without_torchrun_resumes_from_disk_or_names_the_ranks_with_nothing(tmp_path,
                                                                                            uninterrupted):
    """Outside torchrun the ranks choose what to resume before they share any store. A server that
    lost its memory but finds the disk checkpoint resumes, and receives the newer snapshot; a
    server that finds nothing at all stops every rank with an error naming its ranks."""
    import shutil

    # 6 of the 8 steps: disk checkpoint at step 4, each server's snapshot at step 6
    launch("ddp", tmp_path / "run", plan=[], steps=6, every=4, snapshots=True)
    nothing = tmp_path / "nothing"
    shutil.copytree(tmp_path / "run", nothing)
    for run in (tmp_path / "run", nothing):
        shutil.rmtree(run / "shm" / "server1")  # server 1 (ranks 2, 3) replaced: its memory is gone
    shutil.rmtree(nothing / "checkpoints")

    failed = launch_without_torchrun(nothing, steps=8)
    for rank, proc in enumerate(failed):
        assert proc.returncode != 0, (rank, proc.stderr[-3000:])
        assert "ranks [2, 3] found no snapshot or checkpoint to resume from" in proc.stderr, (rank, proc.stderr[-3000:])

    resumed = launch_without_torchrun(tmp_path / "run", steps=8)
    assert all(proc.returncode == 0 for proc in resumed), [proc.stderr[-3000:] for proc in resumed]
    # ranks 2, 3 chose the step-4 disk checkpoint; the ranks agreed on step 6 and server 1 received it
    resumed_from = {r: (tmp_path / "run" / f"resumed_from.{r}").read_text() for r in range(4)}
    assert all(resumed_from[r].endswith(f"shm/server{r // 2}/epoch=1-step=6.ckpt") for r in range(4)), resumed_from
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert [e["resumed_step"] for e in events if e["event"] == "first_step"] == [0, 6]
    assert_same_parameters(finals(tmp_path / "run", "ddp"), uninterrupted["ddp"])


# ---------------------------------------------------------------------- sets, in one process
def write_set(directory: Path, step: int, shards: int = 2) -> Path:
    checkpoint = directory / f"step={step}.ckpt"
    files = [checkpoint] + [checkpoint.with_name(f"{checkpoint.name}.stage{s}") for s in range(1, shards)]
    for i, f in enumerate(files):
        torch.save({"step": step, "stage": i, "w": torch.full((64,), float(step))}, f)
    commit_set(checkpoint, files, step=step, epoch=0)
    return checkpoint


def test_newest_complete_skips_broken_sets_naming_the_file(tmp_path):
    good = write_set(tmp_path, 2)
    truncated = write_set(tmp_path, 4)
    corrupt = write_set(tmp_path, 6)
    missing = write_set(tmp_path, 8)
    mixed = write_set(tmp_path, 10)
    uncommitted = tmp_path / "step=12.ckpt"
    torch.save({"step": 12}, uncommitted)  # written, never committed: no record, never a candidate
    data = truncated.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    stage1 = corrupt.with_name(corrupt.name + ".stage1")
    blob = bytearray(stage1.read_bytes())
    blob[-20] ^= 0xFF
    stage1.write_bytes(bytes(blob))
    missing.with_name(missing.name + ".stage1").unlink()
    # a shard of another step under this set's name, same size: only the checksum tells
    mixed_shard = mixed.with_name(mixed.name + ".stage1")
    torch.save({"step": 11, "stage": 1, "w": torch.full((64,), 11.0)}, mixed_shard)

    found, skipped = newest_complete(tmp_path)
    assert found is not None and found.checkpoint == good and found.step == 2
    reasons = {path.name: reason for path, reason in skipped}
    assert set(reasons) == {"step=4.ckpt", "step=6.ckpt", "step=8.ckpt", "step=10.ckpt"}
    assert "truncated" in reasons["step=4.ckpt"] and str(truncated) in reasons["step=4.ckpt"]
    assert "corrupt" in reasons["step=6.ckpt"] and "stage1" in reasons["step=6.ckpt"]
    assert "missing" in reasons["step=8.ckpt"] and "stage1" in reasons["step=8.ckpt"]
    assert "mixed" in reasons["step=10.ckpt"]
    with pytest.raises(CheckpointSetError, match="never completed"):
        verify_set(uncommitted)


def test_uncommit_removes_the_record_first(tmp_path):
    checkpoint = write_set(tmp_path, 2)
    checkpoint_sets.uncommit(checkpoint)
    assert checkpoint.exists() and newest_complete(tmp_path) == (None, [])


def test_the_strategies_commit_and_verify_their_checkpoints(tmp_path):
    """Every saved checkpoint has a record that verifies; a damaged one is refused when loaded,
    naming the file, and ``ckpt_path="last"`` skips it with a warning."""
    import json

    proc = subprocess.run([sys.executable, str(SCRIPTS / "resumable_checkpoint.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=300, env=child_env(), cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert result["verified_steps"] == [4, 6]  # keep=2: the two newest, each committed
    assert result["direct_load"].startswith("CheckpointSetError") and "truncated" in result["direct_load"]
    assert "step=6" in result["direct_load"]
    assert len(result["warnings"]) == 1 and "step=6" in result["warnings"][0]
    assert "step=4" in result["resumed_from"] and result["resumed_steps"] == 8
