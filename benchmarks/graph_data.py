"""Graph data at ogbn-arxiv size: generation, METIS vs random partition, sampler throughput.

    python benchmarks/graph_data.py [--preset arxiv] [--batches 10]

Writes benchmarks/results/graph_data.{json,md}. Keys: generate_s, write_s, load_s, metis_s,
metis_cut, random_cut, sampler_edges_per_s, baseline_edges_per_s (full 2-hop neighbourhoods of
1,024 seeds: our CSR sampler vs PyG's k_hop_subgraph, same output), sampler_fanout_edges_per_s
(fan-out [15, 10]), and the full 2-hop pair again for 64 seeds (*_small_batch_edges_per_s).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).parent / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="arxiv")
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--parts", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)

    from torch_geometric.utils import k_hop_subgraph

    from lightning_granndis.datamodules import OGBNodeDataModule
    from lightning_granndis.datamodules.synthetic import PRESETS, generate
    from lightning_granndis.graph import CSRGraph, metis_partition, random_partition, sample_subgraph
    from lightning_granndis.report import markdown_table

    res: dict = {"preset": args.preset, "parts": args.parts, "batch_size": 1024, "batches": args.batches}
    t0 = time.perf_counter()
    generate(PRESETS[args.preset])
    res["generate_s"] = time.perf_counter() - t0

    root = Path(tempfile.mkdtemp())
    try:
        dm = OGBNodeDataModule(f"synthetic-{args.preset}", root=str(root))
        t0 = time.perf_counter()
        dm.prepare_data()  # generate + write OGB layout + ogb's processing
        res["write_and_process_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        dm.setup()
        res["load_s"] = time.perf_counter() - t0
    finally:
        shutil.rmtree(root)
    d = dm.data
    res["num_nodes"], res["num_edges_undirected"] = d.num_nodes, d.edge_index.shape[1] // 2

    t0 = time.perf_counter()
    metis = metis_partition(d.edge_index, d.num_nodes, args.parts, train_mask=d.train_mask)
    res["metis_s"] = time.perf_counter() - t0
    rand = random_partition(d.edge_index, d.num_nodes, args.parts, train_mask=d.train_mask)
    res.update(metis_cut=metis.edge_cut, random_cut=rand.edge_cut, metis_balance=metis.balance,
               metis_train_balance=metis.train_balance)

    csr = CSRGraph.from_edge_index(d.edge_index, d.num_nodes)
    g = torch.Generator().manual_seed(0)
    batches = [torch.randperm(d.num_nodes, generator=g)[:1024] for _ in range(args.batches)]

    def rate(fn) -> float:
        edges, t0 = 0, time.perf_counter()
        for seeds in batches:
            edges += fn(seeds)
        return edges / (time.perf_counter() - t0)

    res["sampler_edges_per_s"] = rate(lambda s: sample_subgraph(csr, s, [-1, -1], induced=True).edge_index.shape[1])
    res["baseline_edges_per_s"] = rate(
        lambda s: k_hop_subgraph(s, 2, d.edge_index, num_nodes=d.num_nodes)[1].shape[1])
    res["sampler_fanout_edges_per_s"] = rate(
        lambda s: sample_subgraph(csr, s, [15, 10], generator=g).edge_index.shape[1])
    res["sampler_speedup"] = res["sampler_edges_per_s"] / res["baseline_edges_per_s"]
    # Small batches: our cost follows the sample, k_hop_subgraph's the whole edge list.
    batches = [b[:64] for b in batches]
    res["sampler_small_batch_edges_per_s"] = rate(
        lambda s: sample_subgraph(csr, s, [-1, -1], induced=True).edge_index.shape[1])
    res["baseline_small_batch_edges_per_s"] = rate(
        lambda s: k_hop_subgraph(s, 2, d.edge_index, num_nodes=d.num_nodes)[1].shape[1])

    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "graph_data.json").write_text(json.dumps(res, indent=2) + "\n")
    rows = [
        ["generate (in memory)", f"{res['generate_s']:.2f} s"],
        ["generate + write OGB layout + ogb processing", f"{res['write_and_process_s']:.1f} s"],
        ["load through ogb (setup)", f"{res['load_s']:.2f} s"],
        [f"METIS, {args.parts} parts", f"{res['metis_s']:.2f} s, cut {metis.edge_cut:,} ({100 * metis.cut_fraction:.1f}%), "
                                        f"balance {metis.balance:.3f}"],
        [f"random, {args.parts} parts", f"cut {rand.edge_cut:,} ({100 * rand.cut_fraction:.1f}%)"],
        ["sampler, full 2-hop (edges/s)", f"{res['sampler_edges_per_s']:,.0f}"],
        ["k_hop_subgraph baseline (edges/s)", f"{res['baseline_edges_per_s']:,.0f}"],
        ["sampler, fan-out [15, 10] (edges/s)", f"{res['sampler_fanout_edges_per_s']:,.0f}"],
        ["sampler, full 2-hop, 64 seeds (edges/s)", f"{res['sampler_small_batch_edges_per_s']:,.0f}"],
        ["k_hop_subgraph, 64 seeds (edges/s)", f"{res['baseline_small_batch_edges_per_s']:,.0f}"],
    ]
    text = (f"Graph data, synthetic-{args.preset}: {d.num_nodes:,} vertices, {res['num_edges_undirected']:,} "
            f"undirected edges, one thread\n\n" + markdown_table(["step", "result"], rows)
            + f"\n\nsampler vs k_hop_subgraph (same subgraphs): {res['sampler_speedup']:.1f}x\n")
    (RESULTS / "graph_data.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
