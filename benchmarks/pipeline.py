"""Optimus-CC beside its ablations and torch.distributed.pipelining: a GPT on the standard library.

8 processes = 2 data-parallel replicas x 4 pipeline stages (1F1B, 4 micro-batches), 4 virtual
servers of 2 ranks: each replica's middle boundary (stage 1 -> 2) and every data-parallel
all-reduce cross servers, as in the paper's cluster where pipeline stages and replicas span nodes.
Links: the artifact's cluster (A100 nodes, NVLink 300 GB/s, InfiniBand HDR 200 Gbit/s) with every
bandwidth divided by (A100 dense FP16 FLOP/s / the FLOP/s one rank gets here), emulated; then once
more with an unscaled 1 Gbit/s inter-server link.

Rows: Baseline (uncompressed), CB (Compressed Backpropagation, rank 16, LEP, on the inter-server
boundary), CB-nonLEP, CB+FE (Fused Embedding sync), CB+FE+SC (PowerSGD rank 16 on the DP sync of
stages 0-2, as the artifact's --selective_grad_comp_way 3). Then, with emulation off on 4 ranks (one
replica): Baseline_raw (1F1B and GPipe) beside torch.distributed.pipelining's Schedule1F1B and
ScheduleGPipe on the same blocks, balance and data (the peer's traffic is not in our ledger, and it
cannot tie the embeddings, so its head has its own weight).

Columns: step time (mean after warm-up steps), bytes per step by link class and purpose (all
ranks), validation loss after the same number of steps.

    python benchmarks/pipeline.py [--steps 30] [--hidden 256]

Writes benchmarks/results/pipeline.{json,md,png}: rows keyed by name with step_s, inter_bytes (per
step, all ranks), val_loss; the 1 Gbit/s rows under "gbe1"; settings under "meta".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _results import save_results  # noqa: E402

from lightning_granndis.report import markdown_table  # noqa: E402

WORKER = Path(__file__).parent / "pipeline_worker.py"
CB = {"compress_backward": True, "rank": 16, "inter_server_only": True}
ABLATIONS = {
    "Baseline": {},
    "CB": {**CB, "lep": True},
    "CB-nonLEP": {**CB, "lep": False},
    "CB+FE": {**CB, "fused_embedding": True},
    "CB+FE+SC": {**CB, "fused_embedding": True, "dp_compression": True, "dp_rank": 16, "selective_stages": 3},
}
PURPOSES = ("activation", "activation_grad", "grad_sync", "embedding_sync")


def launch(nproc: int, settings: dict, rows: list[dict], out: Path) -> dict[str, list[dict]]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", str(WORKER),
           str(out), json.dumps(settings), json.dumps(rows)]
    subprocess.run(cmd, check=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    return {r["name"]: [json.loads((out / f"{r['name']}_rank{k}.json").read_text()) for k in range(nproc)]
            for r in rows}


def summarise(ranks: list[dict], steps: int) -> dict:
    """Rank-mean step time; bytes per step summed over ranks (each rank books what it sends)."""
    row = {"step_s": max(r["step_s"] for r in ranks), "val_loss": ranks[0]["val_loss"]}
    if ranks[0]["bytes"]:
        total = {k: sum(r["bytes"][k] for r in ranks) / steps for k in ranks[0]["bytes"]}
        row["inter_bytes"] = sum(v for k, v in total.items() if k.startswith("inter/") and not k.endswith("/other"))
        row["intra_bytes"] = sum(v for k, v in total.items() if k.startswith("intra/") and not k.endswith("/other"))
        row["bytes"] = {k: v for k, v in total.items() if v and not k.endswith("/other")}
        row["scale"], row["link"] = ranks[0]["scale"], ranks[0]["link"]
    return row


def table(rows: dict[str, dict], base: str) -> str:
    headers = ["row", "step s", "speed-up", *(f"inter {p} MB" for p in PURPOSES), "intra MB", "val loss"]
    body = []
    for name, r in rows.items():
        b = r.get("bytes", {})
        body.append([name, r["step_s"], f"{rows[base]['step_s'] / r['step_s']:.2f}x",
                     *(b.get(f"inter/{p}", 0) / 1e6 for p in PURPOSES), r.get("intra_bytes", 0) / 1e6,
                     r["val_loss"] if r["val_loss"] is not None else "-"])
    return markdown_table(headers, body)


def plot(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    for ax, key, title in ((axes[0], "scaled", "A100 + 200 Gbit/s IB, scaled"), (axes[1], "gbe1", "1 Gbit/s")):
        rows = data[key]
        ax.bar(list(rows), [r["step_s"] for r in rows.values()], color="tab:blue")
        ax.set_title(f"step time ({title})")
        ax.set_ylabel("s / step")
        ax.tick_params(axis="x", rotation=30)
    rows = data["scaled"]
    bottom = [0.0] * len(rows)
    for purpose, colour in zip(PURPOSES, ("tab:orange", "tab:red", "tab:green", "tab:purple")):
        values = [r["bytes"].get(f"inter/{purpose}", 0) / 1e6 for r in rows.values()]
        axes[2].bar(list(rows), values, bottom=bottom, label=purpose, color=colour)
        bottom = [b + v for b, v in zip(bottom, values)]
    axes[2].set_title("inter-server MB per step (all ranks)")
    axes[2].legend()
    axes[2].tick_params(axis="x", rotation=30)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--files", type=int, default=60)
    args = parser.parse_args()
    settings = {"warmup": 3, "block": 64, "hidden": args.hidden, "layers": args.layers, "heads": 4, "lr": 3e-3,
                "stages": 4, "micro": 4, "batch": 32, "steps": args.steps, "files": args.files, "val_batches": 8}
    from lightning_granndis.datamodules import TextDataModule

    TextDataModule(max_files=args.files).prepare_data()
    # One factor for every row, measured once: A100 dense FP16 over what one of 8 ranks gets here
    # (a one-thread matmul times its share of the cores).
    from lightning_granndis.link_model import REFERENCE_FLOPS, measure_local_flops

    local = measure_local_flops() * min(1.0, (os.cpu_count() or 1) / 8)
    factor = REFERENCE_FLOPS["a100_fp16"] / local
    scaled = {"preset": "optimus_cc_paper", "scale": factor}
    gbe = {"intra_gbps": 2400, "inter_gbps": 1, "inter_latency_us": 50, "name": "1gbe"}
    data: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for key, link in (("scaled", scaled), ("gbe1", gbe)):
            rows = [{"name": n, "kind": "lightning", "strategy": s, "link": link, "emulate": True, "servers": 4}
                    for n, s in ABLATIONS.items()]
            runs = launch(8, settings, rows, Path(tmp) / key)
            data[key] = {n: summarise(r, args.steps) for n, r in runs.items()}
        raw_rows = [{"name": "Baseline_raw", "kind": "lightning", "link": "optimus_cc_paper", "emulate": False},
                    {"name": "Baseline_raw_gpipe", "kind": "lightning", "schedule": "gpipe",
                     "link": "optimus_cc_paper", "emulate": False}]
        raw = launch(4, settings, raw_rows, Path(tmp) / "raw")
        balance = raw["Baseline_raw"][0]["balance"]
        peers = [{"name": f"torch_pipelining_{s}", "kind": "torch_pipelining", "schedule": s, "balance": balance}
                 for s in ("gpipe", "1f1b")]
        raw.update(launch(4, settings, peers, Path(tmp) / "peer"))
        data["raw"] = {n: summarise(r, args.steps) for n, r in raw.items()}
    base, cb = data["scaled"]["Baseline"], data["scaled"]["CB"]
    grad_cut = base["bytes"]["inter/activation_grad"] / max(1.0, cb["bytes"].get("inter/activation_grad", 0))
    full = data["scaled"]["CB+FE+SC"]
    raw = data["raw"]
    checks = {
        "cb_backward_bytes_cut": grad_cut,
        "cb_fe_sc_speedup_scaled": base["step_s"] / full["step_s"],
        "raw_vs_peer_1f1b": raw["Baseline_raw"]["step_s"] / raw["torch_pipelining_1f1b"]["step_s"],
        "raw_vs_peer_gpipe": raw["Baseline_raw_gpipe"]["step_s"] / raw["torch_pipelining_gpipe"]["step_s"],
    }
    result = {**data["scaled"], **raw, "gbe1": data["gbe1"], "checks": checks,
              "meta": {**settings, "world": 8, "replicas": 2, "servers": 4, "link_scaled": base.get("link"),
                       "scale": factor, "local_flops_per_rank": local, "command": "python benchmarks/pipeline.py"}}
    text = (
        f"# Optimus-CC pipeline benchmark\n\nGPT d={args.hidden}, {args.layers} layers, byte level, block 64, batch "
        f"32 per replica in 4 micro-batches, {args.steps} steps; 2 replicas x 4 stages, 4 virtual servers of 2 "
        f"ranks.\n\n## A100 + InfiniBand 200 Gbit/s, scaled\n\nLinks: {base.get('link')}\n\n"
        f"{table(data['scaled'], 'Baseline')}\n\n## Unscaled 1 Gbit/s between servers\n\n{table(data['gbe1'], 'Baseline')}"
        f"\n\n## Emulation off, 4 ranks (one replica): ours beside torch.distributed.pipelining\n\n"
        f"{table(data['raw'], 'Baseline_raw')}\n\n## Targets\n\n"
        f"- CB cuts the inter-server boundary's backward bytes {grad_cut:.1f}x (target >= 10x)\n"
        f"- CB+FE+SC step time {checks['cb_fe_sc_speedup_scaled']:.2f}x faster than Baseline under the scaled link "
        f"(target > 1)\n"
        f"- Baseline_raw / torch.distributed.pipelining: 1F1B {checks['raw_vs_peer_1f1b']:.2f}x, GPipe "
        f"{checks['raw_vs_peer_gpipe']:.2f}x (target <= 1.2x)\n"
    )
    save_results("pipeline", result, text, lambda p: plot(data, p))


if __name__ == "__main__":
    main()
