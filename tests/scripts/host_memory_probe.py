"""Prints how many MB a freed 20 MB tensor leaves in the process, after glibc's mmap threshold rose
(argv[1] == "release": with :func:`release_freed_memory` first)."""
import sys, torch
from lightning_granndis.host_memory import release_freed_memory
def rss(): return int(open('/proc/self/statm').read().split()[1]) * 4096 / 2**20
if sys.argv[1] == "release":
    assert release_freed_memory()
before = rss()
a = torch.ones(6 * 2**20); del a          # 24 MB, returned either way; raises glibc's threshold
keep = [torch.ones(1000) for _ in range(10)]
b = torch.ones(5 * 2**20); del b          # 20 MB: from the heap once the threshold rose
small = torch.ones(1000)
print(rss() - before)
