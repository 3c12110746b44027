"""Host memory that follows the batch: freed tensors go back to the operating system.

glibc serves an allocation above ``M_MMAP_THRESHOLD`` (128 KiB at start) with its own ``mmap``,
returned to the system on ``free``. But its threshold is *dynamic*: each time such a block is
freed, the threshold rises to its size (up to 32 MiB on 64-bit). After the first batches of
sampled GNN training, every tensor of a later batch (tens of MiB, a different size each batch)
is carved from the heap instead, and the heap keeps what a batch freed, fragmented by the
small allocations between them. Measured here (synthetic-arxiv, MB_base, fan-outs ``[15, 10,
5]``, 4 ranks): a rank's peak RSS grew batch by batch to 2.5 GB; with the threshold fixed it
stayed at 1.56 GB, the process plus one batch's training.

:func:`release_freed_memory` fixes the threshold (``mallopt``), which also stops the dynamic
adjustment, and sets the trim threshold so the heap's top is returned as well. It is
process-wide and lasts for the process; a no-op where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
#: allocations from this size on get their own mapping (glibc's starting value, held fixed)
MMAP_THRESHOLD = 128 * 1024
#: heap top beyond this is given back
TRIM_THRESHOLD = 16 * 1024 * 1024

_done = False


def release_freed_memory() -> bool:
    """Hold glibc's mmap threshold fixed, so freed batch tensors leave the process. Returns
    whether it took effect (``False`` off glibc)."""
    global _done
    if _done:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _done = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _done
