"""ServerTopology: mapping in one process; 2-"node" torchrun launch on localhost."""

import subprocess

import pytest

from helpers import child_env, free_port, read_ranks, torchrun_cmd
from lightning_granndis.topology import ServerTopology


def test_four_ranks_as_two_virtual_servers():
    t = ServerTopology(world_size=4, servers=2)
    assert t.devices_per_server == 2
    assert [t.server_of(r) for r in range(4)] == [0, 0, 1, 1]
    assert [t.slot_of(r) for r in range(4)] == [0, 1, 0, 1]
    assert [t.is_head(r) for r in range(4)] == [True, False, True, False]
    assert t.heads == [0, 2] and t.ranks_of(1) == [2, 3]
    assert t.link(0, 1) == "intra" and t.link(1, 2) == "inter" and t.link(3, 0) == "inter"
    assert t.describe() == "2 virtual servers x 2 devices (4 ranks)"


def test_nodes_are_servers_by_default(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    t = ServerTopology.from_env()
    assert (t.servers, t.nodes, t.devices_per_server) == (2, 2, 4)
    assert ServerTopology.from_env(servers=4).devices_per_server == 2


def test_world_size_that_does_not_divide_is_a_clear_error():
    with pytest.raises(ValueError, match=r"A world of 6 ranks cannot be split into 4 servers.*one of \[1, 2, 3, 6\]"):
        ServerTopology(world_size=6, servers=4)
    with pytest.raises(ValueError, match="a server never spans two nodes"):
        ServerTopology(world_size=6, servers=3, nodes=2)
    with pytest.raises(ValueError, match="rank 4 is outside a world of 4"):
        ServerTopology(world_size=4, servers=2).server_of(4)


def test_two_torchrun_nodes_yield_two_servers(tmp_path):
    port = free_port()
    procs = [
        subprocess.Popen(torchrun_cmd("two_nodes.py", 2, str(tmp_path), nnodes=2, node_rank=n, port=port),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env())
        for n in (0, 1)
    ]
    logs = [p.communicate(timeout=400)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(log[-4000:] for log in logs)
    ranks = read_ranks(tmp_path, 4)
    assert [r["node_rank"] for r in ranks] == [0, 0, 1, 1]
    assert all(r["env_servers"] == 2 and r["servers"] == 2 for r in ranks)
    assert [r["server"] for r in ranks] == [0, 0, 1, 1]
    assert [r["is_head"] for r in ranks] == [True, False, True, False]
    assert [r["intra_sum"] for r in ranks] == [1.0, 1.0, 5.0, 5.0]
    assert [r["inter_grad_bytes"] > 0 for r in ranks] == [True, False, True, False]
