"""Gradient sync: flat all-reduce (plain DDP) vs hierarchical (server_aware_ddp).

2 virtual servers x 2 devices (4 processes, gloo), an MLP on the digits, links emulated as the
GraNNDis artifact's cluster (NVLink inside a server, 10 GbE between; each server's card shared by
its devices). This machine computes ~1000x slower than the cluster's RTX A6000s, so every bandwidth
is scaled down by the measured ratio (LinkModel.scaled_to_reference): the run keeps the cluster's
compute-to-communication ratio. Every config runs in the same torchrun job, one after the other,
on the same data.

    python benchmarks/grad_sync.py [--steps 12] [--reference rtx_a6000]

Writes benchmarks/results/grad_sync.{json,md,png}. Keys of the JSON: ddp_step_s, hier_step_s,
ddp_inter_bytes, hier_inter_bytes (per step, summed over ranks), plus native_ddp_step_s (Lightning's
own DDP, no emulation, for the hook's overhead) and the run's settings.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _results import save_results

WORLD, SERVERS = 4, 2
HIDDEN = [256, 256]


def worker(out: Path, steps: int, scale: float) -> None:
    import lightning.pytorch as pl
    from lightning.pytorch.strategies import DDPStrategy

    import lightning_granndis  # noqa: F401
    from lightning_granndis.callbacks import StepTimer
    from lightning_granndis.datamodules import DigitsDataModule
    from lightning_granndis.models import MLPClassifier
    from lightning_granndis.strategies import ServerAwareDDPStrategy

    from lightning_granndis.link_model import LinkModel

    link = LinkModel.preset("10gbe").scaled(scale)
    configs = {
        "native_ddp": lambda: DDPStrategy(),
        "ddp": lambda: ServerAwareDDPStrategy(servers=SERVERS, link_model=link, emulate=True, hierarchical=False),
        "hier": lambda: ServerAwareDDPStrategy(servers=SERVERS, link_model=link, emulate=True),
    }
    for name, make in configs.items():
        pl.seed_everything(0)
        timer, strategy = StepTimer(warmup=3), make()
        trainer = pl.Trainer(
            accelerator="cpu", devices=WORLD, strategy=strategy, max_steps=steps + 3, logger=False,
            callbacks=[timer], enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
            limit_val_batches=0, num_sanity_val_steps=0,
        )
        model = MLPClassifier(hidden=HIDDEN, dropout=0.0)
        trainer.fit(model, datamodule=DigitsDataModule(batch_size=32))
        record = {"times": timer.times, "params": sum(p.numel() for p in model.parameters()), "steps": steps + 3}
        if getattr(strategy, "comm", None) is not None:
            record["ledger"] = strategy.comm.ledger.to_dict()
            record["link"] = strategy.link_model.describe()
        (out / f"{name}_rank{trainer.global_rank}.json").write_text(json.dumps(record))


def aggregate(out: Path, steps: int) -> dict:
    import statistics

    def load(name):
        return [json.loads((out / f"{name}_rank{r}.json").read_text()) for r in range(WORLD)]

    res: dict = {"world": WORLD, "servers": SERVERS, "steps_timed": steps, "hidden": HIDDEN}
    for name in ("native_ddp", "ddp", "hier"):
        ranks = load(name)
        # a step ends for everyone when the slowest rank ends it: take the max over ranks per step
        per_step = [max(r["times"][i] for r in ranks) for i in range(len(ranks[0]["times"]))]
        res[f"{name}_step_s"] = statistics.median(per_step)
        res["params"] = ranks[0]["params"]
        if name != "native_ddp":
            total = sum(r["ledger"].get("inter/grad_sync", {}).get("bytes", 0) for r in ranks)
            res[f"{name}_inter_bytes"] = total // ranks[0]["steps"]
            intra = sum(r["ledger"].get("intra/grad_sync", {}).get("bytes", 0) for r in ranks)
            res[f"{name}_intra_bytes"] = intra // ranks[0]["steps"]
            res["link"] = ranks[0]["link"]
    res["inter_bytes_ratio"] = res["ddp_inter_bytes"] / res["hier_inter_bytes"]
    res["step_speedup"] = res["ddp_step_s"] / res["hier_step_s"]
    return res


def report(res: dict) -> str:
    from lightning_granndis.report import human_bytes, markdown_table

    rows = [
        ["plain DDP (flat all-reduce), emulated", res["ddp_step_s"] * 1e3, human_bytes(res["ddp_inter_bytes"]),
         human_bytes(res["ddp_intra_bytes"]), 1.0],
        ["server_aware_ddp (hierarchical), emulated", res["hier_step_s"] * 1e3, human_bytes(res["hier_inter_bytes"]),
         human_bytes(res["hier_intra_bytes"]), res["step_speedup"]],
        ["Lightning DDP, real loopback (no emulation)", res["native_ddp_step_s"] * 1e3, "-", "-", "-"],
    ]
    head = (f"Gradient sync, {res['servers']} virtual servers x {res['world'] // res['servers']} devices, "
            f"MLP {res['params'] / 1e6:.3f}M params, links: {res['link']} [emulated]\n"
            f"scale factor {res['link_scale']:.0f} = {res['reference']} peak FP32 / this machine's measured "
            f"{res['local_flops'] / 1e9:.1f} GFLOP/s per process\n\n")
    table = markdown_table(["config", "step ms (median)", "inter bytes/step", "intra bytes/step", "speed-up"], rows)
    return head + table + f"\n\ninter-server bytes ratio flat/hierarchical: {res['inter_bytes_ratio']:.2f}\n"


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.6))
    names = ["plain DDP", "hierarchical"]
    a.bar(names, [res["ddp_step_s"] * 1e3, res["hier_step_s"] * 1e3], color=["tab:gray", "tab:green"])
    a.set_ylabel("median step time (ms)")
    b.bar(names, [res["ddp_inter_bytes"] / 1e6, res["hier_inter_bytes"] / 1e6], color=["tab:gray", "tab:green"])
    b.set_ylabel("inter-server MB per step")
    fig.suptitle(f"gradient sync, 2 servers x 2 devices, 10 GbE scaled {res['link_scale']:.0f}x (emulated)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--reference", default="rtx_a6000", help="accelerator whose compute/comm ratio to keep")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--scale", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args.steps, args.scale)
    import torch

    from lightning_granndis.link_model import REFERENCE_FLOPS, measure_local_flops

    torch.set_num_threads(1)  # what each of the 4 workers gets
    local_flops = measure_local_flops()
    scale = REFERENCE_FLOPS[args.reference] / local_flops
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, OMP_NUM_THREADS="1")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={WORLD}",
               __file__, "--worker", tmp, "--steps", str(args.steps), "--scale", str(scale)]
        subprocess.run(cmd, check=True, env=env)
        res = aggregate(Path(tmp), args.steps)
    res.update(reference=args.reference, local_flops=local_flops, link_scale=scale)
    save_results("grad_sync", res, report(res), lambda path: plot(res, path))


if __name__ == "__main__":
    main()
