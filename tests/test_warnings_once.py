"""Each warning is shown once per launch, not once per rank; separate launches each show it."""

from __future__ import annotations

import sys

import pytest

from helpers import REPO, SCRIPTS, run, torchrun_cmd


def launch(kind: str) -> str:
    cmd = (torchrun_cmd("warn_on_every_rank.py", 3, "torchrun") if kind == "torchrun"
           else [sys.executable, str(SCRIPTS / "warn_on_every_rank.py"), "lightning"])
    proc = run(cmd, timeout=300, cwd=REPO)
    return proc.stdout + proc.stderr


@pytest.mark.parametrize("kind", ["torchrun", "lightning"])
def test_a_warning_every_rank_raises_is_shown_once(kind):
    # under torchrun a second launch shows it again: launches never hide each other's warnings
    for _ in range(2 if kind == "torchrun" else 1):
        printed = launch(kind)
        assert printed.count("UserWarning: a warning every rank raises") == 1, printed[-3000:]
        for rank in range(3):  # what differs between ranks is a different warning: each is shown
            assert printed.count(f"UserWarning: a warning of rank {rank} alone") == 1, printed[-3000:]
