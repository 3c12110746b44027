"""The graph store (graph/store, datamodules/graph_store): what `granndis partition` writes, what
a rank loads, and every way a store can be wrong, refused with a message that names the problem
and the command that fixes it; on every rank of a real 4-process run; and a two-node run whose
nodes each hold only their own server's shard."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from helpers import child_env, free_port, torchrun, torchrun_cmd
from lightning_granndis.cli import main as cli_main
from lightning_granndis.datamodules import ogb as ogb_module
from lightning_granndis.datamodules.dataset_partition import partition_dataset
from lightning_granndis.datamodules.graph_store import GraphStoreDataModule
from lightning_granndis.datamodules.ogb import OGBNodeDataModule
from lightning_granndis.graph.plan import PlanConfig
from lightning_granndis.graph.store import GraphStoreError, load_rank_shard, read_manifest, store_params
from lightning_granndis.graph.store import partition as partition_module
from lightning_granndis.graph.store.shards import build_shards
from test_granndis_strategy import reference


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    OGBNodeDataModule("synthetic-tiny", root=str(root)).prepare_data()
    return root


@pytest.fixture(scope="module")
def flx_store(root):
    out = root / "stores" / "flx"
    assert cli_main(["partition", "--dataset", "synthetic-tiny", "--root", str(root), "--servers", "2",
                     "--devices", "2", "--mode", "flx", "--hops", "3", "--out", str(out)]) == 0
    return out


@pytest.fixture
def store_copy(flx_store, tmp_path):
    return Path(shutil.copytree(flx_store, tmp_path / "store"))


def test_store_holds_a_manifest_and_one_file_per_server_equal_to_the_in_memory_shards(root, flx_store):
    manifest = read_manifest(flx_store)
    assert sorted(p.name for p in flx_store.iterdir()) == sorted(["manifest.json"] + [s["file"] for s in manifest["shards"]])
    assert [s["server"] for s in manifest["shards"]] == [0, 1]
    assert "granndis partition --dataset synthetic-tiny" in manifest["command"]
    dm = OGBNodeDataModule("synthetic-tiny", root=str(root))
    dm.setup()
    cfg = PlanConfig(mode="flx", servers=2, devices_per_server=2, hops=3)
    in_memory = [sh for server in build_shards(dm.data, cfg) for sh in server]
    owned = []
    for rank, expected in enumerate(in_memory):
        shard = load_rank_shard(flx_store, rank, 4, store_params("flx", 2, 2, 3))
        assert (shard.server, shard.device) == (rank // 2, rank % 2)
        for a, b in zip(shard.train + [shard.eval], expected.train + [expected.eval]):
            assert torch.equal(a.graph.n_id, b.graph.n_id) and torch.equal(a.graph.edge_index, b.graph.edge_index)
            assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y) and a.weight == pytest.approx(b.weight)
        owned.append(shard.eval.graph.n_id[: shard.eval.graph.n_owned])
    owned = torch.cat(owned)  # the exact evaluation split covers every vertex once
    assert owned.numel() == dm.data.num_nodes and owned.unique().numel() == dm.data.num_nodes


def test_a_store_for_other_settings_is_refused_naming_each_difference(flx_store):
    with pytest.raises(GraphStoreError) as error:
        load_rank_shard(flx_store, 0, 4, store_params("flx", 2, 2, hops=2, seed=1))
    message = str(error.value)
    assert "hops=3 in the store, 2 here" in message and "seed=0 in the store, 1 here" in message
    assert "granndis partition --dataset synthetic-tiny" in message  # the fix, as a command
    with pytest.raises(GraphStoreError, match=r"2 servers x 2 devices = 4 ranks, but this run has 8"):
        load_rank_shard(flx_store, 0, 8)


def test_settings_a_mode_does_not_read_are_not_compared():
    assert store_params("flx", 2, 2, 3, fanout=7) == store_params("flx", 2, 2, 3, fanout=99)
    assert store_params("eas", 2, 2, 3, fanout=7) != store_params("eas", 2, 2, 3, fanout=99)
    # a sampled mode's store is its sampling source: fan-outs and batch sizes are read at run time
    assert store_params("cob", 2, 2, 3, fanout=7, batch_size=8) == store_params("cob", 2, 2, 3, fanout=99)
    assert store_params("minibatch", 2, 2, 3, batch_size=8) == store_params("minibatch", 2, 2, 3, batch_size=99)
    # an EAS fan-out the same at every hop is stored as the int older stores hold
    assert store_params("eas", 2, 2, 3, fanout=[5, 5], eas_hops=2) == store_params("eas", 2, 2, 3, fanout=5, eas_hops=2)
    with pytest.raises(ValueError, match=r"has 3 entries but the expansion's hops \(eas_hops\) number 2"):
        store_params("eas", 2, 2, 3, fanout=[5, 5, 5], eas_hops=2)
    with pytest.raises(ValueError, match="unknown mode 'flux'"):
        store_params("flux", 2, 2, 3)


def test_missing_manifest_is_not_a_store(tmp_path):
    with pytest.raises(GraphStoreError, match=r"manifest.json is missing.*granndis partition"):
        load_rank_shard(tmp_path, 0, 4)
    with pytest.raises(GraphStoreError, match="manifest.json is missing"):
        GraphStoreDataModule(tmp_path).setup()


def test_missing_truncated_or_corrupt_shards_are_named(store_copy):
    manifest = read_manifest(store_copy)
    shard = store_copy / manifest["shards"][1]["file"]
    data = shard.read_bytes()
    load_rank_shard(store_copy, 0, 4)  # server 0's ranks never read server 1's file
    shard.write_bytes(data[: len(data) // 2])
    with pytest.raises(GraphStoreError, match=rf"{shard.name} is [\d,]+ bytes but the manifest says"):
        load_rank_shard(store_copy, 2, 4)
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(flipped))
    with pytest.raises(GraphStoreError, match="does not match its SHA-256"):
        load_rank_shard(store_copy, 3, 4)
    shard.unlink()
    with pytest.raises(GraphStoreError, match=r"is missing from the graph store.*granndis partition"):
        load_rank_shard(store_copy, 2, 4)
    (store_copy / "manifest.json").write_text("{not json")
    with pytest.raises(GraphStoreError, match="not valid JSON"):
        load_rank_shard(store_copy, 0, 4)


def test_stale_or_wrong_dataset_store_is_refused_by_the_datamodule(root, store_copy):
    dm = GraphStoreDataModule(store_copy, dataset="synthetic-tiny")
    dm.setup()
    assert dm.handle.num_nodes == read_manifest(store_copy)["num_nodes"] and dm.num_classes > 1
    with pytest.raises(GraphStoreError, match="holds 'synthetic-tiny', not 'ogbn-arxiv'"):
        GraphStoreDataModule(store_copy, dataset="ogbn-arxiv").setup()
    source = Path(read_manifest(store_copy)["source"]["file"])
    stat = source.stat()
    try:
        # the processed graph changed after partitioning
        os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
        with pytest.raises(GraphStoreError, match=r"is stale.*granndis partition"):
            GraphStoreDataModule(store_copy).setup()
    finally:
        os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_a_failed_repartition_leaves_the_old_store_whole(root, store_copy, monkeypatch):
    before = read_manifest(store_copy)

    def failing(data, cfg, progress=False):
        shards = build_shards(data, cfg)
        yield next(shards)  # the first server's file is written ...
        raise RuntimeError("killed while partitioning")  # ... then the run dies

    monkeypatch.setattr(partition_module, "build_shards", failing)
    with pytest.raises(RuntimeError, match="killed"):
        partition_dataset("synthetic-tiny", store_copy, "flx", 2, 2, hops=3, root=str(root))
    assert read_manifest(store_copy) == before
    for rank in range(4):
        load_rank_shard(store_copy, rank, 4)  # every file the manifest names is still there and whole
    monkeypatch.undo()
    after = partition_dataset("synthetic-tiny", store_copy, "flx", 2, 2, hops=3, root=str(root), seed=1)
    assert after["generation"] != before["generation"] and after["params"]["seed"] == 1
    # the new generation replaced the old files, and the half-written ones are gone
    assert sorted(p.name for p in store_copy.glob("*.pt")) == sorted(s["file"] for s in after["shards"])


def test_loading_a_graph_too_big_for_every_process_names_the_store(root, monkeypatch):
    dm = OGBNodeDataModule("synthetic-tiny", root=str(root))
    dm.trainer = SimpleNamespace(num_devices=4)
    monkeypatch.setattr(ogb_module, "_available_memory", lambda: 1 << 20)  # 1 MiB free
    with pytest.raises(MemoryError, match=r"each of the 4 processes.*granndis partition --dataset synthetic-tiny"):
        dm.setup()
    monkeypatch.setattr(ogb_module, "_available_memory", lambda: 1 << 40)
    dm.setup()
    assert dm.data.num_nodes > 0


def test_every_rank_refuses_a_store_bad_for_some_ranks(store_copy, tmp_path):
    shard = store_copy / read_manifest(store_copy)["shards"][1]["file"]
    shard.write_bytes(shard.read_bytes()[:100])  # only server 1's ranks read it
    out = tmp_path / "out"
    out.mkdir()
    torchrun("gnn_store_refusal.py", 4, str(out), str(store_copy), "3")
    messages = [(out / f"rank{r}.txt").read_text() for r in range(4)]
    assert all(m.startswith("GraphStoreError") and shard.name in m and "bytes but the manifest" in m
               for m in messages), messages


def test_two_nodes_each_with_only_their_servers_shard_train_exactly(root, flx_store, tmp_path):
    manifest = read_manifest(flx_store)
    for node in (0, 1):  # what each machine of a cluster gets: the manifest and its own server's file
        d = tmp_path / f"node{node}" / "flx"
        d.mkdir(parents=True)
        shutil.copy(flx_store / "manifest.json", d)
        shutil.copy(flx_store / manifest["shards"][node]["file"], d)
    out, port = tmp_path / "out", free_port()
    env = child_env(GNN_STORE_ROOT=str(tmp_path / "node{node}"))
    procs = [subprocess.Popen(torchrun_cmd("gnn_strategies.py", 2, str(out), str(root), "3", "st_flx:sage",
                                           nnodes=2, node_rank=n, port=port),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) for n in (0, 1)]
    logs = [p.communicate(timeout=400)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(log[-4000:] for log in logs)
    ranks = [json.loads((out / "st_flx_sage" / f"rank{r}.json").read_text()) for r in range(4)]
    ref = reference(root, "sage")
    assert [r["server"] for r in ranks] == [0, 0, 1, 1] and all(r["scatters"] == 0 for r in ranks)
    for r in ranks:
        assert torch.allclose(torch.tensor(r["logits"]), ref["logits"][torch.tensor(r["ids"])], atol=1e-5, rtol=0)
        for key, value in ref["params"].items():
            assert torch.allclose(torch.tensor(r["params"][key]), value, atol=1e-5, rtol=0), key


def test_inner_metis_owner_splits_inner_vertices_by_metis_and_outer_ones_follow_a_nearer_neighbour(root):
    from lightning_granndis.graph.partition import metis_partition
    from lightning_granndis.graph.plan import server_assignment
    from lightning_granndis.graph.sampling import CSRGraph
    from lightning_granndis.graph.server_subgraph import preloaded_subgraph
    from lightning_granndis.graph.plan import inner_metis_owner

    dm = OGBNodeDataModule("synthetic-tiny", root=str(root))
    dm.setup()
    d = dm.data
    server_of = server_assignment(d.edge_index, d.num_nodes, 2, d.train_mask)
    sub = preloaded_subgraph(CSRGraph.from_edge_index(d.edge_index, d.num_nodes), (server_of == 0).nonzero().flatten(), 3)
    owner = inner_metis_owner(sub, 2, balance=d.train_mask[sub.n_id])
    assert owner.shape == (sub.num_nodes,) and set(owner.unique().tolist()) == {0, 1}
    inner = (sub.hop == 0).nonzero().flatten()
    src, dst = sub.edge_index
    among = (sub.hop[src] == 0) & (sub.hop[dst] == 0)  # inner vertices come first in a closure
    expected = metis_partition(sub.edge_index[:, among], inner.numel(), 2, train_mask=d.train_mask[sub.n_id[inner]])
    assert torch.equal(owner[inner], expected.assignment)
    outer = (sub.hop > 0).nonzero().flatten()
    assert outer.numel() > 0
    for u in outer.tolist():  # shares a device with an in-neighbour one hop nearer
        nearer = dst[(src == u) & (sub.hop[dst] == sub.hop[u] - 1)]
        assert nearer.numel() > 0 and int(owner[u]) == int(owner[int(nearer.min())])
