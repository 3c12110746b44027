"""4 ranks as 2 virtual servers x 2: every Communicator wrapper on known tensors.

Writes <out>/rank<r>.json with, per operation, this rank's ledger delta and results.
"""

import json
import sys
import time

import torch

from lightning_granndis import comm
from lightning_granndis.link_model import LinkModel
from lightning_granndis.topology import ServerTopology

out_dir = sys.argv[1]
comm.init_from_env("gloo")
torch.set_num_threads(1)
rank = comm.get_rank()
topo = ServerTopology.from_env(servers=2)
groups = comm.server_groups(topo)
# A slow made-up cluster so that emulated delays are long enough to measure.
slow = LinkModel.custom(intra_gbps=8.0, inter_gbps=0.008, intra_latency_us=1.0, inter_latency_us=2000.0, name="slow")
c = comm.Communicator(topo, slow, emulate=False)
result: dict = {"rank": rank, "ops": {}, "values": {}}


def record(name, fn):
    mark = c.ledger.snapshot()
    value = fn()
    result["ops"][name] = c.ledger.since(mark).to_dict()
    return value


t = torch.arange(10, dtype=torch.float32) + rank
record("all_reduce", lambda: c.all_reduce(t, "grad_sync"))
result["values"]["all_reduce"] = t.tolist()

g = record("all_gather", lambda: c.all_gather(torch.full((5,), float(rank)), "other"))
result["values"]["all_gather"] = [x[0].item() for x in g]

rows = torch.arange(20, dtype=torch.float64).view(10, 2) + 100 * rank
a2a, splits = record("all_to_all", lambda: c.all_to_all(rows, [1, 2, 3, 4], "halo", recv_splits=[rank + 1] * 4))
result["values"]["all_to_all"] = {"rows": a2a[:, 0].tolist(), "recv_splits": splits}

b = torch.full((8,), rank, dtype=torch.int64)
record("broadcast", lambda: c.broadcast(b, src=1, purpose="teacher_relay"))
result["values"]["broadcast"] = b.tolist()

r = torch.full((6,), float(rank + 1))
record("reduce", lambda: c.reduce(r, dst=2, purpose="grad_sync"))
result["values"]["reduce"] = r.tolist() if rank == 2 else None

rs = record("reduce_scatter", lambda: c.reduce_scatter(torch.arange(16, dtype=torch.float32).view(8, 2) * (rank + 1), "other"))
result["values"]["reduce_scatter"] = rs.tolist()


def p2p():
    if rank == 0:
        c.send(torch.ones(7), dst=2, purpose="activation")
        got = c.recv(torch.zeros(3), src=1, purpose="activation_grad")
        return got.tolist()
    if rank == 1:
        c.send(torch.full((3,), 5.0), dst=0, purpose="activation_grad")
    if rank == 2:
        return c.recv(torch.zeros(7), src=0, purpose="activation").tolist()
    return None


result["values"]["p2p"] = record("p2p", p2p)

intra = groups.intra_of(topo, rank)
s = torch.tensor([float(rank)])
c.all_reduce(s, "other", group=intra)
result["values"]["intra_group_sum"] = s.item()
h = torch.tensor([float(rank)])
if topo.is_head(rank):
    c.all_reduce(h, "other", group=groups.heads)
result["values"]["heads_sum"] = h.item()

# ---- autograd: adjoint identity <A x, w> summed over ranks == <x, A^T w> summed over ranks
gen = torch.Generator().manual_seed(rank)
adjoint = {}
for name, fn, shape in [
    ("exchange", lambda x: c.exchange(x, [1, 2, 0, 3], "halo"), (6, 3)),
    ("all_gather_autograd", lambda x: c.all_gather_autograd(x, "other"), (4, 3)),
    ("all_reduce_autograd", lambda x: c.all_reduce_autograd(x, "other"), (4, 3)),
]:
    x = torch.randn(*shape, generator=gen, dtype=torch.float64, requires_grad=True)
    y = fn(x)
    w = torch.randn(y.shape, generator=gen, dtype=torch.float64)
    (y * w).sum().backward()
    lhs = torch.tensor([(y.detach() * w).sum().item()], dtype=torch.float64)
    rhs = torch.tensor([(x.detach() * x.grad).sum().item()], dtype=torch.float64)
    c.all_reduce(lhs, "other")
    c.all_reduce(rhs, "other")
    adjoint[name] = [lhs.item(), rhs.item()]
    if name == "all_reduce_autograd":
        total_w = w.clone()
        c.all_reduce(total_w, "other")
        adjoint["all_reduce_grad_max_err"] = (x.grad - total_w).abs().max().item()
result["adjoint"] = adjoint

# ---- emulation: inter-server operations last at least their modelled time
c.ledger.reset()
c.emulate = True
timings = []
for _ in range(3):
    mark = c.ledger.snapshot()
    t0 = time.perf_counter()
    c.all_reduce(torch.ones(1000), "grad_sync")
    wall = time.perf_counter() - t0
    d = c.ledger.since(mark).get("inter", "grad_sync")
    timings.append({"wall": wall, "booked": d.seconds, "modelled": d.modelled_seconds, "bytes": d.bytes})
mark = c.ledger.snapshot()
comm.barrier()
if rank == 0:
    c.send(torch.ones(25_000), dst=3, purpose="activation")
elif rank == 3:
    c.recv(torch.zeros(25_000), src=0, purpose="activation")
d = c.ledger.since(mark).get("inter", "activation")
result["emulation"] = {"all_reduce": timings, "send": {"booked": d.seconds, "modelled": d.modelled_seconds, "bytes": d.bytes}}
result["slow_model"] = {"inter_bw": slow.bandwidth("inter"), "inter_latency": slow.inter.latency,
                        "intra_bw": slow.bandwidth("intra"), "intra_latency": slow.intra.latency}

with open(f"{out_dir}/rank{rank}.json", "w") as f:
    json.dump(result, f)
comm.barrier()
comm.destroy()
