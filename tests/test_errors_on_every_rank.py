"""When one rank raises, every rank's error names the failing rank and its exception, promptly."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest

from helpers import REPO, SCRIPTS, child_env, free_port


def run_failing(tmp_path, case: str) -> tuple[dict[int, str], float]:
    """Each rank's stderr (torchrun --tee prefixes every line with its rank) and the wall time."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=4", "--master-addr=127.0.0.1",
           f"--master-port={free_port()}", "--tee=2", str(SCRIPTS / "fail_on_one_rank.py"), str(tmp_path), case]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=child_env(), cwd=REPO)
    elapsed = time.monotonic() - t0
    assert proc.returncode != 0
    per_rank: dict[int, str] = {r: "" for r in range(4)}
    for line in (proc.stdout + proc.stderr).splitlines():
        m = re.match(r"\[default(\d)\]:(.*)", line)
        if m:
            per_rank[int(m.group(1))] += m.group(2) + "\n"
    return per_rank, elapsed


@pytest.mark.parametrize("case, cause", [
    ("pipeline", r"TypeError: pipeline block 2 \(ReturnsATuple\) returned tuple"),  # on stage 2 of 4
    ("ddp", r"ValueError: row 5 is corrupt"),  # a data error on the rank that draws row 5
])
def test_every_rank_names_the_rank_that_failed_and_its_exception(tmp_path, case, cause):
    output, elapsed = run_failing(tmp_path, case)
    failing = [r for r, text in output.items() if re.search(rf"^(\[rank\d\]: )?{cause}", text, re.M)]
    assert len(failing) == 1, output
    origin = failing[0]
    assert f"raised on rank {origin} of 4" in output[origin]
    for r, text in output.items():
        if r != origin:  # its collective broke off, or it was waiting on a live peer: either way, named
            assert re.search(rf"rank {origin} of 4 failed (first )?with {cause}", text), (r, text[-3000:])
    # no hang: the run ends once the ranks have said why, not at the process group's timeout
    assert elapsed < 90, elapsed


def test_a_failure_caught_on_every_rank_does_not_poison_the_next_fit(tmp_path):
    """A sweep catches a configuration's failed fit on every rank; the next fit and a validate in
    the same processes run to the end (before, the failure watch took the old error for a peer's
    failure and stopped them)."""
    from helpers import torchrun

    torchrun("caught_failure.py", 4, str(tmp_path), "4", timeout=300)
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["first"].startswith("caught: loss is nan")
    assert result["second_steps"] == 6
    assert result["validate"] == 1  # one validation loader, run to its end
