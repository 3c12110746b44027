"""Running a benchmark's workers as subprocesses (one process, or 4 ranks under torchrun) and
telling from their output how they ended."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).parent.parent
OOM_MARKERS = ("out of memory", "DefaultCPUAllocator: can't allocate memory", "MemoryError", "Cannot allocate memory")


def run_logged(cmd: list[str], log: Path, timeout: float, refused=lambda tail: False) -> tuple[str, str]:
    """Runs ``cmd`` (one thread per process) into ``log``; returns ``(status, the log's tail)``:
    ``ok``, ``timeout``, ``refused`` (``refused(tail)`` says so: checked before an OOM), ``oom``
    (killed, or out of memory) or ``failed``."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    with open(log, "w") as f:
        try:
            code = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=REPO, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    tail = log.read_text()[-8000:]
    if code == 0:
        return "ok", tail
    if code == "timeout":
        return "timeout", tail
    if refused(tail):
        return "refused", tail
    if code in (-9, 137) or "SIGKILL" in tail or any(m in tail for m in OOM_MARKERS):
        return "oom", tail
    return "failed", tail


def failure_reason(tail: str, width: int = 300) -> str:
    """The last error line of a failed run's output."""
    lines = [ln.strip() for ln in tail.splitlines()
             if ("Error" in ln or "refuse" in ln) and "ChildFailedError" not in ln and "errors.html" not in ln]
    return (lines[-1] if lines else tail.strip().splitlines()[-1] if tail.strip() else "")[:width]


def worker_cmd(script: str, *args: str, nproc: int = 1) -> list[str]:
    """``script --worker ARGS`` in one process, or under torchrun with ``nproc`` ranks."""
    if nproc == 1:
        return [sys.executable, script, "--worker", *args]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", script,
            "--worker", *args]
