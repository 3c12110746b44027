"""GraNNDis beside its baselines: FB_base, MB_base, FLX, CoB and EAS on the arxiv-sized graph.

2 virtual servers x 2 devices (4 processes, gloo, one thread each). Links: the paper's cluster
(NVLink 112 GB/s inside a server, InfiniBand 32 Gbit/s between servers) with every bandwidth
divided by a measured factor, so that the compute-to-link ratio is the paper's; then once more with
an unscaled 1 Gbit/s inter-server link (the paper's low-end cluster). The factor is the RTX A6000's
peak FP32 FLOP/s over the FLOP/s one rank gets here (a one-thread matmul, times the rank's share of
the cores) — the same derivation as benchmarks/grad_sync.py. GNN layers are partly memory-bound, so
the memory-bandwidth factor is printed beside it, and the table shows FB_base's inter-server share
of its epoch next to the paper's measured 44-86% (§8.2) as a check of the scaling.

Each configuration runs as its own torchrun job (peak memory is per process), in the same run of
this script, on the same graph. Per configuration: epoch time and its four-way breakdown
(compute, intra-server comm, inter-server comm, gradient sync; epochs after the first), bytes per
link class and epoch, test accuracy after a fixed number of epochs (exact, gathered, OGB
Evaluator), peak memory per rank, and the epoch time the paper's cost model (Eqs. 1-3) predicts on
the paper's 4 servers x 4 GPUs. A single-process full-graph run for the same epochs gives the
reference accuracy.

Timing and accuracy come from separate runs, so that three seeds fit in about an hour here: the
emulated runs time ``--time-epochs`` epochs of the full-batch modes (the first excluded) and
``--mb-steps`` steps of the mini-batch modes (their epoch extrapolated by steps); the accuracy runs
train ``--epochs`` / ``--mb-epochs`` without emulation (emulation changes time, not arithmetic) for
``--seeds`` seeds (the seed varies the model's initialisation), and the reference trains the same
seeds in one process (with a CSR adjacency: the same arithmetic as PyG's default path, 2.4x faster).

    python benchmarks/gnn.py [--preset arxiv] [--epochs 40] [--mb-epochs 1] [--seeds 3]

Writes benchmarks/results/gnn.{json,md,png}. The JSON is keyed by mode (fb_base, mb_base, flx,
cob, eas) with epoch_s, inter_bytes, intra_bytes (per epoch, all ranks, training traffic),
test_acc (mean over seeds), test_acc_std, test_accs, peak_mem_mb, ...; the 1 Gbit/s run under
"gbe1"; settings and the reference under "meta".
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _results import save_results

DATA = Path(__file__).parent.parent / "data"
WORLD, SERVERS, DEVICES = 4, 2, 2
HIDDEN, LAYERS = 64, 3
MODES = ("fb_base", "mb_base", "flx", "cob", "eas")
FULL_BATCH = ("fb_base", "flx", "eas")


def make_strategy(mode: str, link, cache_dir: str, emulate: bool):
    from lightning_granndis.strategies import (
        FullGraphBaselineStrategy,
        MiniBatchBaselineStrategy,
        ServerAwareGNNStrategy,
    )

    common = dict(servers=SERVERS, link_model=link, emulate=emulate, cache_dir=cache_dir)
    if mode == "fb_base":
        return FullGraphBaselineStrategy(**common)
    if mode == "mb_base":
        return MiniBatchBaselineStrategy(fanout=25, batch_size=1024, **common)
    if mode == "cob":
        return ServerAwareGNNStrategy(mode="cob", fanout=25, batch_size=1024, **common)
    return ServerAwareGNNStrategy(mode=mode, **common)


def worker(out: Path, mode: str, dataset: str, epochs: int, link_json: str, seed: int, limit: int,
           emulate: bool) -> None:
    """One configuration under torchrun: emulated and timed (``limit`` steps per epoch, 0 = all), or
    unemulated and evaluated."""
    import lightning.pytorch as pl

    import lightning_granndis  # noqa: F401
    from lightning_granndis.callbacks import CommMonitor, PeakMemory
    from lightning_granndis.datamodules import OGBNodeDataModule
    from lightning_granndis.link_model import LinkModel
    from lightning_granndis.models import GNNNodeClassifier

    link = LinkModel.resolve(json.loads(link_json))
    pl.seed_everything(seed)
    dm = OGBNodeDataModule(dataset, root=str(DATA))
    dm.setup()
    model = GNNNodeClassifier(dm.num_features, dm.num_classes, hidden=HIDDEN, num_layers=LAYERS)
    strategy = make_strategy(mode, link, str(DATA / "metis-cache"), emulate)
    monitor, memory = CommMonitor(dirpath=str(out / mode)), PeakMemory()
    trainer = pl.Trainer(accelerator="cpu", devices=WORLD, strategy=strategy, max_epochs=epochs, logger=False,
                         callbacks=[monitor, memory], enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, check_val_every_n_epoch=10**6,
                         limit_train_batches=limit or None)
    t0 = time.perf_counter()
    trainer.fit(model, datamodule=dm)
    fit_s = time.perf_counter() - t0
    ledger = strategy.comm.ledger.to_dict()
    steps = trainer.global_step
    iterations = len(strategy._sampled) if strategy._sampled is not None else int(trainer.num_training_batches)
    record = {
        "epochs": monitor.epochs, "ledger": ledger, "memory": memory.per_rank, "steps": steps, "fit_s": fit_s,
        "links": strategy.link_model.describe(), "iterations": iterations,
        "timed_iterations": int(trainer.num_training_batches),
    }
    if not emulate:
        trainer.test(model, datamodule=dm, verbose=False)
        record["test_acc"] = strategy.last_eval.get("test")
    if trainer.is_global_zero:
        (out / f"{mode}.json").write_text(json.dumps(record))


def reference_run(dataset: str, epochs: int, seed: int = 0, csr: bool = False) -> dict:
    """Single-process full-graph training: test accuracy after ``epochs``, and the compute speed
    (with PyG's default message passing, or a CSR adjacency: the same arithmetic)."""
    import lightning.pytorch as pl
    import torch
    import torch.nn.functional as F

    from lightning_granndis.datamodules import OGBNodeDataModule
    from lightning_granndis.graph.adjacency import csr_adjacency
    from lightning_granndis.models import GNNNodeClassifier

    pl.seed_everything(seed)
    dm = OGBNodeDataModule(dataset, root=str(DATA))
    dm.setup()
    d = dm.data
    adj = csr_adjacency(d.edge_index, d.num_nodes) if csr else d.edge_index
    model = GNNNodeClassifier(dm.num_features, dm.num_classes, hidden=HIDDEN, num_layers=LAYERS)
    opt = model.configure_optimizers()
    times = []
    for _ in range(epochs):
        t0 = time.perf_counter()
        model.train()
        loss = F.cross_entropy(model(d.x, adj)[d.train_mask], d.y[d.train_mask])
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    model.eval()
    with torch.no_grad():
        pred = model(d.x, adj).argmax(-1)
    epoch_s = sum(times[1:]) / max(1, len(times) - 1)
    return {"test_acc": dm.evaluate(pred, "test"), "epoch_s": epoch_s, "vertices_per_s": d.num_nodes / epoch_s,
            "threads": torch.get_num_threads()}


def modelled_paper_cluster(dataset: str, C_local: float, speed_scale: float) -> dict[str, float]:
    """Eqs. 1-3 on the paper's 4 servers x 4 A6000 (unscaled links), with the expansion ``R``
    measured on a 4-server METIS split of this graph and ``C`` = this machine's vertices/s times the
    speed factor."""
    import torch

    from lightning_granndis.datamodules import OGBNodeDataModule
    from lightning_granndis.graph.cost_model import epoch_times
    from lightning_granndis.graph.plan import server_assignment
    from lightning_granndis.graph.sampling import CSRGraph
    from lightning_granndis.graph.server_subgraph import expansion_subgraph, preloaded_subgraph
    from lightning_granndis.link_model import LinkModel

    dm = OGBNodeDataModule(dataset, root=str(DATA))
    dm.setup()
    d = dm.data
    graph = CSRGraph.from_edge_index(d.edge_index, d.num_nodes)
    server_of = server_assignment(d.edge_index, d.num_nodes, 4, d.train_mask, cache_dir=str(DATA / "metis-cache"))
    inner = [(server_of == s).nonzero().flatten() for s in range(4)]
    gen = torch.Generator().manual_seed(0)
    R_flx = sum(preloaded_subgraph(graph, i, LAYERS).num_nodes for i in inner) / d.num_nodes
    R_eas = sum(expansion_subgraph(graph, i, 1, 15, True, gen).num_nodes for i in inner) / d.num_nodes
    link = LinkModel.preset("granndis_paper")
    per_vertex = 4 * HIDDEN * 2 * LAYERS
    t = epoch_times(d.num_nodes, int(d.edge_index.shape[1]), 4, 4, C_local * speed_scale,
                    link.bandwidth("intra") / per_vertex, link.bandwidth("inter") / per_vertex, R_flx, R_eas)
    return {"fb_base": t["fb"], "flx": t["flx"], "eas": t["eas"], "R_flx": R_flx, "R_eas": R_eas}


def summarise(record: dict) -> dict:
    """Per-epoch figures of a timing run; a run of fewer steps than an epoch is scaled to the
    epoch's step count (``extrapolated``)."""
    from lightning_granndis.report import TIME_CATEGORIES, training_bytes

    epochs = record["epochs"][1:] or record["epochs"]
    avg = {k: sum(e[k] for e in epochs) / len(epochs) for k in (*TIME_CATEGORIES, "total")}
    n_epochs = len(record["epochs"])
    scale = record["iterations"] / record["timed_iterations"]
    # the ledger is rank 0's; bytes per link over all ranks come from the monitor's merged totals
    return {
        "epoch_s": avg["total"] * scale, "breakdown_s": {k: avg[k] * scale for k in TIME_CATEGORIES},
        "inter_bytes": record["inter_bytes"] * scale, "intra_bytes": record["intra_bytes"] * scale,
        "rank0_inter_bytes": training_bytes(record["ledger"], "inter") / n_epochs * scale,
        "peak_mem_mb": max(m["peak_mem_mb"] for m in record["memory"]),
        "activation_mb": max(m["activation_mb"] for m in record["memory"]),
        "steps_per_epoch": record["iterations"], "timed_steps": record["timed_iterations"], "epochs": n_epochs,
        "extrapolated": scale != 1, "fit_s": record["fit_s"],
    }


def _torchrun(tmp: Path, mode: str, dataset: str, epochs: int, link_spec: dict, seed: int, limit: int,
              emulate: bool) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={WORLD}", __file__,
           "--worker", str(tmp), "--mode", mode, "--dataset", dataset, "--epochs", str(epochs),
           "--link", json.dumps(link_spec), "--seed", str(seed), "--limit", str(limit), "--emulate", str(int(emulate))]
    subprocess.run(cmd, check=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    return json.loads((tmp / f"{mode}.json").read_text())


def run_all(tmp: Path, dataset: str, link_spec: dict, time_epochs: int, mb_steps: int) -> dict[str, dict]:
    """Emulated timing runs of every mode under ``link_spec``."""
    from lightning_granndis.report import training_bytes

    out = {}
    for mode in MODES:
        n, limit = (time_epochs, 0) if mode in FULL_BATCH else (1, mb_steps)
        print(f"--- timing {mode} ({n} epochs{f', {limit} steps' if limit else ''}, links {link_spec})", flush=True)
        record = _torchrun(tmp, mode, dataset, n, link_spec, 0, limit, emulate=True)
        merged = json.loads((tmp / mode / "comm_breakdown.json").read_text())["total"]
        for link in ("inter", "intra"):
            record[f"{link}_bytes"] = training_bytes(merged, link) / n
        out[mode] = summarise(record)
        out[mode]["links"] = record["links"]
    return out


def _mean_std(values: list[float]) -> dict:
    return {"test_acc": statistics.mean(values), "test_acc_std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "test_accs": values}


def accuracy_runs(tmp: Path, dataset: str, epochs: int, mb_epochs: int, seeds: int) -> dict[str, dict]:
    """Test accuracy of every mode after a fixed training length, over ``seeds`` seeds, unemulated."""
    out = {}
    for mode in MODES:
        n = epochs if mode in FULL_BATCH else mb_epochs
        accs = []
        for seed in range(seeds):
            print(f"--- accuracy {mode} ({n} epochs, seed {seed})", flush=True)
            accs.append(_torchrun(tmp, mode, dataset, n, {"preset": "granndis_paper"}, seed, 0, emulate=False)["test_acc"])
        out[mode] = {**_mean_std(accs), "epochs": n}
    return out


def report(res: dict) -> str:
    from lightning_granndis.report import markdown_table

    meta = res["meta"]
    ref = meta["reference"]

    acc = res["accuracy"]

    def table(runs: dict, modelled: dict | None) -> str:
        fb = runs["fb_base"]["epoch_s"]
        rows = []
        for mode in MODES:
            r = runs[mode]
            b = r["breakdown_s"]
            timed = f"{r['timed_steps']} of {r['steps_per_epoch']} steps" if r["extrapolated"] else f"{r['epochs']} epochs"
            rows.append([
                mode, f"{r['epoch_s']:.2f}" + (" (extrapolated)" if r["extrapolated"] else ""),
                f"{fb / r['epoch_s']:.2f}x", b["compute"], b["intra_comm"], b["inter_comm"],
                b["grad_sync"], r["inter_bytes"] / 1e6, r["intra_bytes"] / 1e6, r["steps_per_epoch"], timed,
                f"{100 * acc[mode]['test_acc']:.2f} ± {100 * acc[mode]['test_acc_std']:.2f} ({acc[mode]['epochs']} ep)",
                r["peak_mem_mb"], r["activation_mb"],
                (f"{modelled[mode]:.3g}" if modelled and mode in modelled else "n/a"),
            ])
        headers = ("mode", "epoch s", "vs FB_base", "compute s", "intra s", "inter s", "grad sync s", "inter MB/ep",
                   "intra MB/ep", "steps/ep", "timed", f"test acc % ({meta['seeds']} seeds)", "peak RSS MB",
                   "activations MB", "modelled 4x4 s")
        return markdown_table(headers, rows)

    text = [
        f"# GNN strategies on synthetic-{meta['preset']} ({meta['num_nodes']:,} vertices, {meta['num_edges']:,} edges), "
        f"2 servers x 2 devices",
        "",
        f"Links scaled by {meta['scale']:.0f}x: RTX A6000 peak FP32 38.7 TFLOP/s / this machine's "
        f"{meta['rank_flops'] / 1e9:.1f} GFLOP/s per rank (one-thread matmul {meta['flops'] / 1e9:.1f} GFLOP/s x core "
        f"share {meta['core_share']:.2f}). A memory-bandwidth ratio would give {meta['memory_scale']:.0f}x "
        f"(one-thread copy {meta['mem_bw'] / 1e9:.2f} GB/s). Check: FB_base spends "
        f"{100 * res['scaled']['fb_base']['breakdown_s']['inter_comm'] / res['scaled']['fb_base']['epoch_s']:.0f}% of "
        "its epoch on inter-server communication here; the paper measured 44-86% (§8.2). "
        "Emulated: every inter-server operation lasts at least its modelled time.",
        "",
        f"Single-process full-graph reference after {meta['epochs']} epochs: test accuracy "
        f"{100 * ref['test_acc']:.2f} ± {100 * ref['test_acc_std']:.2f}% over {meta['seeds']} seeds "
        f"({', '.join(f'{100 * a:.2f}' for a in ref['test_accs'])}); {ref['epoch_s']:.2f} s/epoch with PyG's default "
        f"message passing ({ref['threads']} threads). Accuracy runs are unemulated and train {meta['epochs']} epochs "
        f"(full-batch modes) or {meta['mb_epochs']} epoch (mini-batch modes); timing runs are emulated, "
        f"{meta['time_epochs']} epochs (the first excluded) or {meta['mb_steps']} steps extrapolated to the epoch.",
        "",
        "## Scaled paper cluster (NVLink 112 GB/s, InfiniBand 32 Gbit/s)",
        "",
        table(res["scaled"], res["meta"]["modelled_4x4"]),
        "",
        "## Unscaled 1 Gbit/s inter-server link, PCIe inside (the paper's low-end cluster)",
        "",
        table(res["gbe1"], None),
        "",
        f"Modelled 4x4: the paper's cost model (Eqs. 1-3) for 4 servers x 4 A6000 with expansion R measured on a "
        f"4-server split (FLX {meta['modelled_4x4']['R_flx']:.2f}, EAS {meta['modelled_4x4']['R_eas']:.2f}); it covers "
        "the full-batch modes only. Bytes are per epoch over all ranks, training traffic (evaluation excluded). "
        "Peak RSS includes the interpreter, libraries and the whole graph each rank loads; activations are what "
        "autograd saved in the largest step.",
    ]
    return "\n".join(text) + "\n"


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lightning_granndis.report import TIME_CATEGORIES, TIME_COLOURS

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    for ax, key, title in ((axes[0], "scaled", "scaled paper cluster"), (axes[1], "gbe1", "1 Gbit/s")):
        bottom = [0.0] * len(MODES)
        for cat in TIME_CATEGORIES:
            vals = [res[key][m]["breakdown_s"][cat] for m in MODES]
            ax.bar(MODES, vals, bottom=bottom, color=TIME_COLOURS[cat], label=cat.replace("_", " "))
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.set_title(f"epoch time, {title}")
        ax.set_ylabel("seconds per rank")
        ax.legend(fontsize=8)
    runs = res["scaled"]
    x = range(len(MODES))
    axes[2].bar([i - 0.2 for i in x], [runs[m]["peak_mem_mb"] for m in MODES], 0.4, label="peak RSS MB")
    axes[2].bar([i + 0.2 for i in x], [runs[m]["activation_mb"] for m in MODES], 0.4, label="activations MB")
    axes[2].set_xticks(list(x))
    axes[2].set_xticklabels(MODES)
    axes[2].set_title("memory per rank (max over ranks)")
    axes[2].legend(fontsize=8)
    fig.suptitle(f"GraNNDis vs baselines, synthetic-{res['meta']['preset']}, 2 servers x 2 devices (emulated links)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="arxiv")
    parser.add_argument("--epochs", type=int, default=40, help="epochs of the full-batch modes' accuracy runs")
    parser.add_argument("--mb-epochs", type=int, default=1, help="epochs of the mini-batch modes' accuracy runs")
    parser.add_argument("--seeds", type=int, default=3, help="seeds of the accuracy runs")
    parser.add_argument("--time-epochs", type=int, default=4, help="epochs of the full-batch modes' timing runs")
    parser.add_argument("--mb-steps", type=int, default=6, help="steps of the mini-batch modes' timing runs")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--dataset", help=argparse.SUPPRESS)
    parser.add_argument("--link", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--limit", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--emulate", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args.mode, args.dataset, args.epochs, args.link, args.seed, args.limit,
                      bool(args.emulate))
    import torch

    from lightning_granndis.datamodules import OGBNodeDataModule
    from lightning_granndis.link_model import (
        REFERENCE_FLOPS,
        REFERENCE_MEMORY_BW,
        measure_local_flops,
        measure_local_memory_bandwidth,
    )

    dataset = f"synthetic-{args.preset}"
    dm = OGBNodeDataModule(dataset, root=str(DATA))
    dm.prepare_data()
    dm.setup()
    torch.set_num_threads(1)  # what each worker gets
    core_share = min(1.0, (os.cpu_count() or 1) / WORLD)
    mem_bw, flops = measure_local_memory_bandwidth(), measure_local_flops()
    scale = REFERENCE_FLOPS["rtx_a6000"] / (flops * core_share)
    ref = reference_run(dataset, args.time_epochs)  # one thread, as a rank; C per rank = its speed x core share
    meta = {
        "preset": args.preset, "num_nodes": dm.data.num_nodes, "num_edges": int(dm.data.edge_index.shape[1]),
        "epochs": args.epochs, "mb_epochs": args.mb_epochs, "seeds": args.seeds, "time_epochs": args.time_epochs,
        "mb_steps": args.mb_steps, "mem_bw": mem_bw, "core_share": core_share,
        "rank_flops": flops * core_share, "flops": flops, "scale": scale,
        "memory_scale": REFERENCE_MEMORY_BW["rtx_a6000"] / (mem_bw * core_share),
        "modelled_4x4": modelled_paper_cluster(dataset, ref["vertices_per_s"] * core_share, scale),
    }
    res = {"meta": meta}
    with tempfile.TemporaryDirectory() as tmp:
        res["scaled"] = run_all(Path(tmp) / "scaled", dataset, {"preset": "granndis_paper", "scale": scale},
                                args.time_epochs, args.mb_steps)
        res["gbe1"] = run_all(Path(tmp) / "gbe1", dataset, {"preset": "1gbe"}, args.time_epochs, args.mb_steps)
        res["accuracy"] = accuracy_runs(Path(tmp) / "accuracy", dataset, args.epochs, args.mb_epochs, args.seeds)
    print(f"--- accuracy: one process ({args.epochs} epochs, {args.seeds} seeds)", flush=True)
    ref_accs = [reference_run(dataset, args.epochs, seed, csr=True)["test_acc"] for seed in range(args.seeds)]
    meta["reference"] = {**ref, **_mean_std(ref_accs)}
    # top level keyed by mode (the scaled run, with its accuracy), the 1 Gbit/s run under "gbe1"
    out = {**{m: {**res["scaled"][m], **res["accuracy"][m], "timed_epochs": res["scaled"][m]["epochs"]}
              for m in MODES}, "gbe1": res["gbe1"], "meta": meta}
    save_results("gnn", out, report(res), lambda path: plot(res, path))


if __name__ == "__main__":
    main()
