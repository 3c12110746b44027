"""Prints how many MB a freed 20 MB tensor leaves in the process after glibc's mmap threshold
rose (``argv[1] == "release"``: with :func:`release_freed_memory` called first)."""

import sys

import torch

from lightning_granndis.host_memory import release_freed_memory


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


if sys.argv[1] == "release":
    assert release_freed_memory()
before = rss_mb()
a = torch.ones(6 * 2**20)  # 24 MB: returned either way, but its free raises glibc's threshold
del a
keep = [torch.ones(1000) for _ in range(10)]
b = torch.ones(5 * 2**20)  # 20 MB: from the heap once the threshold rose, kept there after free
del b
small = torch.ones(1000)
print(rss_mb() - before)
