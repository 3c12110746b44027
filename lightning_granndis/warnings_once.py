"""Each warning once per launch, not once per rank.

Every rank of a multi-process run imports the same libraries and runs the same code, so Python's
own filter (once per location *per process*) prints each third-party warning ``world_size`` times.
:func:`install` wraps :func:`warnings.showwarning`: a warning is shown by the first process of the
launch that emits it and skipped by the others. Processes agree through marker files (created with
``O_EXCL``, so exactly one process wins) in a directory named after the launch:

- ranks started by Lightning's launcher are children of rank 0, which names the launch in an
  environment variable they inherit;
- ranks started by ``torchrun`` share its run id, rendezvous port, restart count and agent process.

A process that is neither (a plain script, a test runner) names a launch of its own, so unrelated
runs never hide each other's warnings. Warnings of one launch that differ in their text (a rank
number, a file name) are different warnings and each is shown.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
import warnings
from pathlib import Path

ENV = "LIGHTNING_GRANNDIS_LAUNCH"
_ROOT = Path(tempfile.gettempdir()) / "lightning_granndis_warnings"
_original = None


def launch_key() -> str:
    """A name shared by the processes of this launch (on this machine)."""
    env = os.environ
    if "TORCHELASTIC_RUN_ID" in env:
        return "torchrun-" + "-".join(str(part) for part in (
            env["TORCHELASTIC_RUN_ID"], env.get("MASTER_PORT", ""), env.get("TORCHELASTIC_RESTART_COUNT", "0"),
            os.getppid()))
    inherited = env.get(ENV, "")
    # a Lightning launcher child: started by the process that named the launch, with a local rank
    if inherited and env.get("LOCAL_RANK", "0") != "0" and inherited.split("-")[0] == str(os.getppid()):
        return inherited
    own = f"{os.getpid()}-{time.time_ns()}"
    env[ENV] = own
    return own


def first_to_show(message: str, directory: Path) -> bool:
    """Whether this process is the first of the launch to show ``message`` (and now claims it)."""
    marker = directory / hashlib.sha1(message.encode("utf-8", "replace")).hexdigest()
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    except OSError:  # no usable temporary directory: show it, as Python would
        return True
    return True


def install() -> None:
    """Shows each distinct warning once per launch (idempotent)."""
    global _original
    if _original is not None:
        return
    directory = _ROOT / launch_key()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        _sweep(_ROOT, keep=directory)
    except OSError:
        return
    _original = warnings.showwarning

    def showwarning(message, category, filename, lineno, file=None, line=None):
        text = f"{category.__name__}|{filename}|{lineno}|{message}"
        if first_to_show(text, directory):
            _original(message, category, filename, lineno, file, line)

    warnings.showwarning = showwarning


def _sweep(root: Path, keep: Path, age_s: float = 86400.0) -> None:
    """Removes the marker directories of launches older than a day."""
    now = time.time()
    for old in root.iterdir():
        if old == keep:
            continue
        try:
            if now - old.stat().st_mtime > age_s:
                for marker in old.iterdir():
                    marker.unlink(missing_ok=True)
                old.rmdir()
        except OSError:
            continue
