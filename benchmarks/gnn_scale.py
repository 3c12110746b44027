"""GraNNDis at scale: memory, set-up and epoch time from a small graph to an ogbn-products-sized one,
trained from graph stores on this machine (4 ranks = 2 virtual servers x 2 devices, gloo, one
thread each; links not emulated: memory and set-up are the point here, benchmarks/gnn.py models
the links).

Per preset (small, arxiv, arxiv4x, products) and row:

- ``one`` / ``one_csr``: one process, the whole graph, full-graph SAGE training with PyG's default
  ``edge_index`` message passing / with a ``torch.sparse`` CSR adjacency (no ``E x F`` gather);
- ``fb_base``, ``mb_base``, ``flx``, ``eas``, ``cob``: 4 ranks, each reading its own shard of a
  store written once by ``granndis partition`` (partition seconds and peak RSS from its manifest).

Columns: status (``ok``, ``oom``: the process ran out of memory, ``refused``: the strategy or the
partitioner said no, with why), partition s, shard bytes, per-rank shard load s, per-rank peak RSS
(max and sum over ranks), epoch s (mean over epochs after the first where there are several; for
the sampled modes at the large presets, the mean per-iteration time of the first ``--limit``
iterations times the epoch's iterations: "extrapolated"), test accuracy (exact full-graph
evaluation over the shards) after a fixed number of epochs, mean +- std over seeds. Per preset the
CSR sampler's edges/s against PyG's ``k_hop_subgraph`` on the same seeds (full 3-hop
induced neighbourhoods of 1,024 random seeds; the same subgraphs). And a what-if table: the cost model
for ogbn-papers100M on the paper's 4 servers x 4 A6000 (48 GB).

    python benchmarks/gnn_scale.py [--presets small,arxiv,arxiv4x,products]

Writes benchmarks/results/gnn_scale.{json,md,png}: JSON keyed by preset, then row, with
``status``, ``peak_rss_mb`` (max over ranks), ``epoch_s``, ``test_acc``, ...; ``sampler_speedup``
per preset; settings under ``meta``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _launch import failure_reason, run_logged, worker_cmd
from _results import save_results

REPO = Path(__file__).parent.parent
DATA = REPO / "data"
WORLD, SERVERS, DEVICES = 4, 2, 2
HIDDEN, LAYERS = 64, 3
ROWS = ("one", "one_csr", "fb_base", "mb_base", "flx", "eas", "cob")
STORE_MODE = {"fb_base": "full", "mb_base": "minibatch", "flx": "flx", "eas": "eas", "cob": "cob"}
SAMPLED = ("mb_base", "cob")
#: epochs per preset (accuracy after this many), seeds (small and arxiv: 3), iterations timed of
#: the sampled modes where a whole epoch would take too long here (None: whole epochs)
EPOCHS = {"small": 10, "arxiv": 3, "arxiv4x": 2, "products": 1}
SEEDS = {"small": 3, "arxiv": 3}
LIMIT = {"arxiv": {"mb_base": 4}, "arxiv4x": {"mb_base": 4, "cob": 4}, "products": {"mb_base": 4, "cob": 4}}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---------------------------------------------------------------------------- workers (subprocesses)
def one_process(out: Path, dataset: str, epochs: int, seed: int, csr: bool) -> None:
    import lightning.pytorch as pl
    import torch
    import torch.nn.functional as F

    from lightning_granndis.datamodules import OGBNodeDataModule
    from lightning_granndis.graph.adjacency import csr_adjacency
    from lightning_granndis.models import GNNNodeClassifier

    torch.set_num_threads(1)
    pl.seed_everything(seed)
    t0 = time.perf_counter()
    dm = OGBNodeDataModule(dataset, root=str(DATA))
    dm.setup()
    d = dm.data
    adj = csr_adjacency(d.edge_index, d.num_nodes) if csr else d.edge_index
    load_s = time.perf_counter() - t0
    model = GNNNodeClassifier(dm.num_features, dm.num_classes, hidden=HIDDEN, num_layers=LAYERS)
    opt = model.configure_optimizers()
    times = []
    for epoch in range(epochs):
        t0 = time.perf_counter()
        model.train()
        loss = F.cross_entropy(model(d.x, adj)[d.train_mask], d.y[d.train_mask])
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        print(f"  one process{' (CSR)' if csr else ''}: epoch {epoch} {times[-1]:.1f}s", flush=True)
    model.eval()
    with torch.no_grad():
        pred = model(d.x, adj).argmax(-1)
    record = {"load_s": load_s, "epoch_times": times, "test_acc": dm.evaluate(pred, "test"), "peak_rss_mb": peak_rss_mb()}
    (out / "rank0.json").write_text(json.dumps(record))


def ranks(out: Path, dataset: str, row: str, store: str, epochs: int, seed: int, limit: int | None) -> None:
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import Callback

    import lightning_granndis  # noqa: F401
    from lightning_granndis.datamodules import OGBNodeDataModule
    from lightning_granndis.models import GNNNodeClassifier
    from lightning_granndis.strategies import (
        FullGraphBaselineStrategy,
        MiniBatchBaselineStrategy,
        ServerAwareGNNStrategy,
    )

    class EpochTimer(Callback):
        def __init__(self):
            self.times, self.batches, self._t0 = [], [], 0.0

        def on_train_epoch_start(self, trainer, pl_module):
            self._t0 = time.perf_counter()

        def on_train_epoch_end(self, trainer, pl_module):
            self.times.append(time.perf_counter() - self._t0)
            if trainer.is_global_zero:
                print(f"  {row}: epoch {trainer.current_epoch} {self.times[-1]:.1f}s", flush=True)

    pl.seed_everything(seed)
    # the seed varies the model's initialisation; partitioning and sampling keep the store's seed
    common = dict(servers=SERVERS, link_model="10gbe")
    strategy = {
        "fb_base": lambda: FullGraphBaselineStrategy(**common),
        "mb_base": lambda: MiniBatchBaselineStrategy(fanout=25, batch_size=1024, **common),
        "flx": lambda: ServerAwareGNNStrategy(mode="flx", **common),
        "eas": lambda: ServerAwareGNNStrategy(mode="eas", **common),
        "cob": lambda: ServerAwareGNNStrategy(mode="cob", fanout=25, batch_size=1024, **common),
    }[row]()
    dm = OGBNodeDataModule(dataset, root=str(DATA), store=store)
    dm.setup()
    model = GNNNodeClassifier(dm.num_features, dm.num_classes, hidden=HIDDEN, num_layers=LAYERS)
    timer = EpochTimer()
    trainer = pl.Trainer(accelerator="cpu", devices=WORLD, strategy=strategy, max_epochs=epochs, logger=False,
                         callbacks=[timer], enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, check_val_every_n_epoch=10**6,
                         limit_train_batches=limit)
    trainer.fit(model, datamodule=dm)
    iterations = len(strategy._sampled) if strategy._sampled is not None else int(trainer.num_training_batches)
    record = {"load_s": strategy.shard_seconds.get("train"), "epoch_times": timer.times, "iterations": iterations,
              "timed_iterations": int(trainer.num_training_batches), "peak_rss_mb": peak_rss_mb()}
    if limit is None:
        trainer.test(model, datamodule=dm, verbose=False)
        record["test_acc"] = strategy.last_eval.get("test")
    record["peak_rss_mb"] = peak_rss_mb()
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


def sampler(out: Path, dataset: str, batches: int = 5) -> None:
    """Edges per second of the CSR sampler and of ``k_hop_subgraph`` on the same full 3-hop
    neighbourhoods (the same subgraphs: every edge among the reached vertices)."""
    import torch
    from torch_geometric.utils import k_hop_subgraph

    from lightning_granndis.datamodules import OGBNodeDataModule
    from lightning_granndis.graph import CSRGraph, sample_subgraph

    torch.set_num_threads(1)
    dm = OGBNodeDataModule(dataset, root=str(DATA))
    dm.setup()
    d = dm.data
    csr = CSRGraph.from_edge_index(d.edge_index, d.num_nodes)
    g = torch.Generator().manual_seed(0)
    seeds = [torch.randperm(d.num_nodes, generator=g)[:1024] for _ in range(batches)]

    def rate(fn) -> float:
        edges, t0 = 0, time.perf_counter()
        for s in seeds:
            edges += fn(s)
        return edges / (time.perf_counter() - t0)

    ours = rate(lambda s: sample_subgraph(csr, s, [-1] * LAYERS, induced=True).edge_index.shape[1])
    theirs = rate(lambda s: k_hop_subgraph(s, LAYERS, d.edge_index, num_nodes=d.num_nodes)[1].shape[1])
    (out / "rank0.json").write_text(json.dumps({"sampler_edges_per_s": ours, "k_hop_edges_per_s": theirs,
                                                "sampler_speedup": ours / theirs}))


# ---------------------------------------------------------------------------- driver
def _refused(tail: str) -> bool:
    return "refuse" in tail or "GraphStoreError" in tail or "does not fit" in tail or "ValueError" in tail


def _run(cmd: list[str], log: Path, timeout: float) -> tuple[str, str]:
    return run_logged(cmd, log, timeout, refused=_refused)


def _worker_cmd(*args: str, nproc: int = 1) -> list[str]:
    return worker_cmd(__file__, *args, nproc=nproc)


def reusable(out: Path, dataset: str, row: str) -> bool:
    """Whether ``out`` holds a complete store of ``dataset`` made for this row's parameters (its
    manifest records the partitioning step's own seconds and peak memory)."""
    from lightning_granndis.graph.store.partition import store_params

    manifest_path = out / "manifest.json"
    if not manifest_path.exists():
        return False
    manifest = json.loads(manifest_path.read_text())
    sampled = row in ("cob", "mb_base")
    wanted = store_params(STORE_MODE[row], SERVERS, DEVICES, LAYERS, fanout=25 if sampled else None)
    return manifest.get("dataset") == dataset and manifest.get("params") == wanted and all(
        (out / e["file"]).exists() for e in manifest["shards"])


def partition(preset: str, row: str, tmp: Path, reuse: bool = False) -> dict:
    dataset = f"synthetic-{preset}"
    out = DATA / "stores" / preset / STORE_MODE[row]
    if reuse and reusable(out, dataset, row):
        print(f"--- {preset}/{row}: reusing the store in {out}", flush=True)
        manifest = json.loads((out / "manifest.json").read_text())
        return {"status": "ok", "store": str(out), "reused": True, "partition_s": manifest["partition_seconds"],
                "partition_peak_rss_mb": manifest["partition_peak_rss_mb"],
                "shard_bytes": [e["bytes"] for e in manifest["shards"]],
                "structure_bytes": (manifest["structure"] or {}).get("bytes", 0)}
    cmd = [sys.executable, "-m", "lightning_granndis.cli", "partition", "--dataset", dataset, "--root", str(DATA),
           "--servers", str(SERVERS), "--devices", str(DEVICES), "--mode", STORE_MODE[row], "--hops", str(LAYERS),
           "--out", str(out)]
    if row in ("cob", "mb_base"):
        cmd += ["--fanout", "25", "--batch-size", "1024"]
    print(f"--- {preset}/{row}: partition ({STORE_MODE[row]})", flush=True)
    t0 = time.perf_counter()
    status, tail = _run(cmd, tmp / f"{preset}_{row}_partition.log", timeout=3600)
    result = {"status": status, "store": str(out), "wall_s": time.perf_counter() - t0}
    if status != "ok":
        result["reason"] = failure_reason(tail)
        return result
    manifest = json.loads((out / "manifest.json").read_text())
    result.update(partition_s=manifest["partition_seconds"], partition_peak_rss_mb=manifest["partition_peak_rss_mb"],
                  shard_bytes=[e["bytes"] for e in manifest["shards"]],
                  structure_bytes=(manifest["structure"] or {}).get("bytes", 0))
    return result


def summarise(records: list[dict], extrapolate: bool) -> dict:
    times = records[0]["epoch_times"]
    kept = times[1:] or times
    epoch_s = statistics.mean(kept)
    if extrapolate:
        epoch_s = epoch_s / records[0]["timed_iterations"] * records[0]["iterations"]
    rss = [r["peak_rss_mb"] for r in records]
    return {"epoch_s": epoch_s, "extrapolated": extrapolate, "peak_rss_mb": max(rss), "peak_rss_sum_mb": sum(rss),
            "rank_rss_mb": rss, "load_s": [r.get("load_s") for r in records], "test_acc": records[0].get("test_acc"),
            "iterations": records[0].get("iterations")}


def run_row(preset: str, row: str, tmp: Path, store: str | None) -> dict:
    dataset, epochs = f"synthetic-{preset}", EPOCHS[preset]
    limit = LIMIT.get(preset, {}).get(row)
    seeds = range(SEEDS.get(preset, 1) if limit is None else 1)
    per_seed = []
    for seed in seeds:
        out = tmp / f"{preset}_{row}_{seed}"
        out.mkdir(parents=True, exist_ok=True)
        n = 1 if row.startswith("one") else WORLD
        args = (["one", str(out), dataset, str(epochs), str(seed), str(row == "one_csr")] if n == 1 else
                ["ranks", str(out), dataset, row, store, str(epochs), str(seed), str(limit or 0)])
        print(f"--- {preset}/{row}: seed {seed}, {epochs} epoch(s)" + (f", {limit} iterations timed" if limit else ""),
              flush=True)
        status, tail = _run(_worker_cmd(*args, nproc=n), out / "log.txt", timeout=3600)
        if status != "ok":
            return {"status": status, "reason": failure_reason(tail)}
        per_seed.append(summarise([json.loads((out / f"rank{r}.json").read_text()) for r in range(n)], bool(limit)))
    result = {"status": "ok", **per_seed[0], "seeds": len(per_seed)}
    accs = [s["test_acc"] for s in per_seed if s["test_acc"] is not None]
    if accs:
        result["test_acc"] = statistics.mean(accs)
        result["test_acc_std"] = statistics.stdev(accs) if len(accs) > 1 else 0.0
    result["epoch_s"] = statistics.mean(s["epoch_s"] for s in per_seed)
    return result


def run_preset(preset: str, tmp: Path, rows: tuple[str, ...] = ROWS, sampler_too: bool = True,
               reuse: bool = False) -> dict:
    from lightning_granndis.datamodules import OGBNodeDataModule

    dataset = f"synthetic-{preset}"
    t0 = time.perf_counter()
    OGBNodeDataModule(dataset, root=str(DATA)).prepare_data()  # generated once, then cached under data/
    res: dict = {"prepare_s": time.perf_counter() - t0}
    manifest_info = None
    for row in rows:
        entry: dict = {}
        store = None
        if row in STORE_MODE:
            part = partition(preset, row, tmp, reuse)
            entry["partition"] = part
            if part["status"] != "ok":
                res[row] = {**entry, "status": "refused" if part["status"] in ("refused", "failed") else part["status"],
                            "reason": part.get("reason")}
                print(f"    {row}: {res[row]['status']}: {res[row]['reason']}", flush=True)
                continue
            store = part["store"]
            manifest_info = manifest_info or json.loads((Path(store) / "manifest.json").read_text())
        entry.update(run_row(preset, row, tmp, store))
        res[row] = entry
        print(f"    {row}: {json.dumps({k: v for k, v in entry.items() if k != 'partition'})[:400]}", flush=True)
    if sampler_too:
        out = tmp / f"{preset}_sampler"
        out.mkdir(exist_ok=True)
        status, tail = _run(_worker_cmd("sampler", str(out), dataset), out / "log.txt", timeout=3600)
        res["sampler"] = json.loads((out / "rank0.json").read_text()) if status == "ok" else {"status": status,
                                                                                             "reason": failure_reason(tail)}
        res["sampler_speedup"] = res["sampler"].get("sampler_speedup")
    if manifest_info:
        res["num_nodes"], res["num_edges"] = manifest_info["num_nodes"], manifest_info["num_edges"]
    return res


def papers100m_what_if() -> list[dict]:
    """The cost model (Eqs. 1-3) for ogbn-papers100M on 4 servers x 4 A6000, and which modes' per-GPU
    memory fits 48 GB, with R (the expansion) at the paper's figures for FLX (whole-graph closure)
    and EAS (its 1-hop, fan-out-15 expansion)."""
    from lightning_granndis.graph.cost_model import epoch_times
    from lightning_granndis.link_model import LinkModel

    n, e, f, classes = 111_059_956, 3_231_371_744, 128, 172  # ogbn-papers100M, undirected edges counted twice
    servers, gpus = 4, 4
    link = LinkModel.preset("granndis_paper")
    per_vertex = 4 * HIDDEN * 2 * LAYERS
    C = 2.0e7  # vertices per second per A6000 for a 3-layer hidden-64 SAGE epoch (forward + backward), assumed
    R = {"fb": 1.0, "flx": 4.0, "eas": 1.6}
    t = epoch_times(n, e, servers, gpus, C, link.bandwidth("intra") / per_vertex, link.bandwidth("inter") / per_vertex,
                    R["flx"], R["eas"])

    def per_gpu_gb(r: float) -> float:
        # features + 3 layers' activations (kept for backward) of the rank's vertices, CSR edges, fp32
        vertices = n * r / (servers * gpus)
        edges = e * r / (servers * gpus)
        return (vertices * (f + LAYERS * HIDDEN * 3) * 4 + edges * 12) / 1e9

    rows = []
    for mode, r in (("fb_base", 1.0), ("flx", R["flx"]), ("eas", R["eas"])):
        gb = per_gpu_gb(r)
        rows.append({"mode": mode, "R": r, "per_gpu_gb": gb, "fits_48gb": gb <= 48,
                     "modelled_epoch_s": t["fb" if mode == "fb_base" else mode]})
    return rows


def _note(x: dict) -> str:
    """What the status means, in words (a killed rank's peers only report the lost connection)."""
    reason = x.get("reason") or ""
    if x["status"] != "oom":
        return reason[:120]
    if x.get("partition", {}).get("status") == "oom":
        return "the partitioning step ran out of memory (OOM-killed)"
    if "49237745600" in reason or "can't allocate" in reason:
        return "PyG's E x F message tensor: " + reason[reason.find("you tried"):][:60]
    return "a rank was OOM-killed while training (its peers saw the connection close)"


def report(res: dict) -> str:
    from lightning_granndis.report import markdown_table

    def fmt(x, spec="{:.2f}"):
        return "n/a" if x is None else spec.format(x)

    text = ["# GraNNDis at scale: 4 ranks (2 servers x 2 devices) from graph stores vs one process", "",
            f"This machine: {os.cpu_count()} cores, one thread per process, gloo; links not emulated. "
            "SAGE, 3 layers, hidden 64. Peak RSS is the whole process (interpreter, libraries, shard, training).", ""]
    for preset, r in res.items():
        if preset == "meta" or preset == "papers100m_what_if":
            continue
        text += [f"## synthetic-{preset} ({r.get('num_nodes', 0):,} vertices, {r.get('num_edges', 0):,} directed edges), "
                 f"{EPOCHS[preset]} epoch(s), {SEEDS.get(preset, 1)} seed(s)", ""]
        rows = []
        for row in ROWS:
            x = r[row]
            part = x.get("partition", {})
            acc = x.get("test_acc")
            rows.append([
                row, x["status"], fmt(part.get("partition_s"), "{:.1f}"),
                fmt((sum(part["shard_bytes"]) + part["structure_bytes"]) / 2**20 if "shard_bytes" in part else None,
                    "{:.0f}"),
                fmt(max(v for v in x["load_s"] if v is not None) if x.get("load_s") and any(x["load_s"]) else None),
                fmt(x.get("peak_rss_mb"), "{:,.0f}"), fmt(x.get("peak_rss_sum_mb"), "{:,.0f}"),
                fmt(x.get("epoch_s")) + (" (extrapolated)" if x.get("extrapolated") else ""),
                "n/a" if acc is None else f"{100 * acc:.2f} ± {100 * x.get('test_acc_std', 0):.2f}",
                _note(x),
            ])
        text.append(markdown_table(("row", "status", "partition s", "shards MiB", "load s (max rank)",
                                    "peak RSS MB (max rank)", "peak RSS MB (sum)", "epoch s", "test acc %", "note"),
                                   rows))
        s = r["sampler"]
        text += ["", f"CSR sampler: {fmt(s.get('sampler_edges_per_s'), '{:,.0f}')} edges/s, k_hop_subgraph "
                     f"{fmt(s.get('k_hop_edges_per_s'), '{:,.0f}')} edges/s: {fmt(r.get('sampler_speedup'))}x.", ""]
    text += ["## What if: ogbn-papers100M on the paper's 4 servers x 4 A6000 (48 GB), cost model Eqs. 1-3", "",
             markdown_table(("mode", "R", "per-GPU GB (est.)", "fits 48 GB", "modelled epoch s"),
                            [[w["mode"], w["R"], f"{w['per_gpu_gb']:.1f}", w["fits_48gb"], f"{w['modelled_epoch_s']:.2f}"]
                             for w in res["papers100m_what_if"]]),
             "", "Per-GPU memory: the rank's share of vertices times R with features and three layers of kept "
                 "activations, plus its CSR edges; C = 2e7 vertices/s per GPU assumed; R for FLX and EAS as the "
                 "paper's papers100M discussion (§8) implies."]
    return "\n".join(text) + "\n"


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    presets = [p for p in res if p not in ("meta", "papers100m_what_if")]
    sizes = [res[p].get("num_nodes", 0) for p in presets]
    fig, ax = plt.subplots(figsize=(8, 5))
    for row in ROWS:
        xs, ys = [], []
        for p, n in zip(presets, sizes):
            if res[p][row]["status"] == "ok":
                xs.append(n)
                ys.append(res[p][row]["peak_rss_mb"] / 1024)
        if xs:
            ax.plot(xs, ys, marker="o", label=row)
        for p, n in zip(presets, sizes):
            if res[p][row]["status"] != "ok":
                ax.scatter([n], [0], marker="x", color="red")
    ax.set_xscale("log")
    ax.set_xlabel("vertices")
    ax.set_ylabel("peak RSS per process (GiB; max over ranks)")
    ax.set_title("memory per process against graph size (x at 0: oom / refused)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="small,arxiv,arxiv4x,products")
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--rows", default=",".join(ROWS) + ",sampler",
                        help="rows to run (and 'sampler'); with fewer than all, the others are kept from the "
                             "committed results file")
    parser.add_argument("--reuse-stores", action="store_true",
                        help="train from stores already under data/stores made for the same parameters instead of "
                             "partitioning again (their manifests give the partitioning figures)")
    parser.add_argument("--report-only", action="store_true",
                        help="rewrite the markdown and plot from benchmarks/results/gnn_scale.json")
    args = parser.parse_args()
    if args.report_only:
        res = json.loads((Path(__file__).parent / "results" / "gnn_scale.json").read_text())
        return save_results("gnn_scale", res, report(res), lambda path: plot(res, path))
    if args.worker:
        kind, out, *rest = args.worker
        if kind == "one":
            return one_process(Path(out), rest[0], int(rest[1]), int(rest[2]), rest[3] == "True")
        if kind == "ranks":
            dataset, row, store, epochs, seed, limit = rest
            return ranks(Path(out), dataset, row, store, int(epochs), int(seed), int(limit) or None)
        return sampler(Path(out), rest[0])
    wanted = args.rows.split(",")
    rows = tuple(r for r in ROWS if r in wanted)
    partial = set(wanted) != set(ROWS) | {"sampler"}
    committed = Path(__file__).parent / "results" / "gnn_scale.json"
    res: dict = json.loads(committed.read_text()) if partial and committed.exists() else {}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for preset in args.presets.split(","):
            fresh = run_preset(preset, Path(tmp), rows, "sampler" in wanted, args.reuse_stores)
            res[preset] = {**res.get(preset, {}), **fresh}
            print(f"=== {preset} done at {time.perf_counter() - t0:.0f}s", flush=True)
    res["papers100m_what_if"] = papers100m_what_if()
    meta = {"world": WORLD, "servers": SERVERS, "devices": DEVICES, "hidden": HIDDEN, "layers": LAYERS,
            "epochs": EPOCHS, "seeds": SEEDS, "limit": LIMIT, "wall_s": time.perf_counter() - t0}
    if partial:  # which rows this run re-measured, beside the earlier full run's settings
        meta = {**res.get("meta", {}), "rerun": [*res.get("meta", {}).get("rerun", []),
                                                 {"presets": args.presets, "rows": wanted,
                                                  "wall_s": meta["wall_s"]}]}
    res["meta"] = meta
    save_results("gnn_scale", res, report(res), lambda path: plot(res, path))


if __name__ == "__main__":
    main()
