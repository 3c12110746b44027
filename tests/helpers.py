"""Launching real multi-process runs from tests (never in-process DDP under pytest)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).parent / "scripts"
REPO = Path(__file__).parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "WANDB_MODE": "offline"})
    for key in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK"):
        env.pop(key, None)
    env.update(extra)
    return env


def torchrun_cmd(script: str, nproc: int, *args: str, nnodes: int = 1, node_rank: int = 0, port: int | None = None):
    return [
        sys.executable, "-m", "torch.distributed.run",
        f"--nnodes={nnodes}", f"--node-rank={node_rank}", f"--nproc-per-node={nproc}",
        "--master-addr=127.0.0.1", f"--master-port={port or free_port()}",
        str(SCRIPTS / script), *args,
    ]


def run(cmd: list[str], timeout: float = 400, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=kw.pop("env", child_env()),
                          cwd=kw.pop("cwd", REPO), **kw)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}")
    return proc


def torchrun(script: str, nproc: int, *args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    return run(torchrun_cmd(script, nproc, *args), timeout=timeout)


def read_ranks(directory: Path, world: int, stem: str = "rank") -> list[dict]:
    return [json.loads((directory / f"{stem}{r}.json").read_text()) for r in range(world)]
