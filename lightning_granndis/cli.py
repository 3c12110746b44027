"""The ``granndis`` command: LightningCLI over the suite's strategies, models and DataModules.

    granndis fit --config recipes/granndis_flx.yaml
    granndis validate --config recipes/demo.yaml --ckpt_path runs/demo/.../last.ckpt
    granndis compare recipes/granndis_flx.yaml recipes/gnn_fb_base.yaml [--trainer.max_epochs=10 ...]
    granndis partition --dataset synthetic-products --servers 2 --devices 2 --mode eas --out stores/products_eas

Every ``fit`` writes ``summary.json`` into the run's ``default_root_dir``; ``compare`` runs each
config's ``fit`` in turn (same extra arguments) and prints a table of them side by side.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

from lightning.pytorch.cli import LightningCLI

import lightning_granndis  # noqa: F401  (registers the strategies)


class GranndisCLI(LightningCLI):
    """LightningCLI that prints a readable summary after ``fit``, ``validate`` and ``test``."""

    def before_fit(self) -> None:
        self._t0 = time.perf_counter()

    def after_fit(self) -> None:
        self._summary("fit")

    def after_validate(self) -> None:
        self._summary("validate")

    def after_test(self) -> None:
        self._summary("test")

    def _summary(self, stage: str) -> None:
        trainer = self.trainer
        if not trainer.is_global_zero:
            return
        lines = [f"== {stage} summary =="]
        if stage == "fit":
            lines.append(f"epochs: {trainer.current_epoch}   steps: {trainer.global_step}   "
                         f"wall: {time.perf_counter() - getattr(self, '_t0', time.perf_counter()):.1f} s")
        strategy = trainer.strategy
        topology = getattr(strategy, "topology", None)
        mode = getattr(strategy, "resolved_mode", None)
        lines.append(f"strategy: {type(strategy).__name__}" + (f" (mode {mode})" if mode else "")
                     + (f" on {topology.describe()}" if topology else ""))
        choice = getattr(strategy, "choice", None)
        if choice is not None:
            lines.append(f"auto mode: {choice.reason}")
        for key, value in sorted(trainer.callback_metrics.items()):
            lines.append(f"{key:>24}: {float(value):.4f}")
        ckpt = getattr(trainer.checkpoint_callback, "best_model_path", "") if trainer.checkpoint_callback else ""
        if ckpt:
            lines.append(f"checkpoint: {ckpt}")
        print("\n".join(lines), flush=True)
        if stage == "fit":
            self._write_summary(trainer)

    def _write_summary(self, trainer) -> None:
        from lightning_granndis.callbacks import CommMonitor

        strategy = trainer.strategy
        monitor = next((c for c in trainer.callbacks if isinstance(c, CommMonitor)), None)
        ledger = monitor.summary["total"] if monitor is not None and monitor.summary else {}
        record = {
            "strategy": type(strategy).__name__,
            "mode": getattr(strategy, "resolved_mode", None),
            "epochs": trainer.current_epoch,
            "steps": trainer.global_step,
            "wall_s": time.perf_counter() - getattr(self, "_t0", time.perf_counter()),
            "metrics": {k: float(v) for k, v in trainer.callback_metrics.items()},
            "epoch_breakdown": monitor.epochs if monitor is not None else [],
            "ledger": ledger,
            "links": strategy.link_model.describe() if hasattr(strategy, "link_model") else None,
            "report": getattr(strategy, "report", None) or None,  # e.g. Pipe-BD's schedule, predicted vs measured
        }
        path = Path(trainer.default_root_dir) / "summary.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=2))


def run(args: list[str] | None = None) -> GranndisCLI:
    """Runs the CLI and returns it (for tests and notebooks)."""
    return GranndisCLI(save_config_kwargs={"overwrite": True}, args=args)


def compare_table(runs: dict[str, dict], baseline: str | None = None) -> str:
    """Markdown table of ``fit`` summaries side by side; speed-ups against ``baseline`` (default:
    the last run). Epoch times average the epochs after the first (set-up and warm-up); runs with
    no per-epoch breakdown (no ``CommMonitor``) show their wall clock per epoch instead."""
    from lightning_granndis.report import TIME_CATEGORIES, markdown_table, training_bytes

    def epoch_avg(record: dict) -> dict[str, float]:
        epochs = record["epoch_breakdown"][1:] or record["epoch_breakdown"]
        keys = (*TIME_CATEGORIES, "total")
        return {k: sum(e[k] for e in epochs) / max(1, len(epochs)) for k in keys}

    def link_bytes(record: dict, link: str) -> float:
        return training_bytes(record["ledger"], link) / max(1, record["epochs"])

    # classifiers report accuracy, distillation the assembled student's, relationship models
    # Recall@50 (k=1, k=all, zero-shot), language models loss
    found = [m for m in ("val_R@50_k1", "val_acc", "val_student_acc") if any(m in r["metrics"] for r in runs.values())]
    metrics = ["val_loss"] if not found else (["val_R@50_k1", "val_R@50_kall", "val_zs_R@50_k1"]
                                             if found[0] == "val_R@50_k1" else found[:1])
    baseline = baseline or list(runs)[-1]
    # without a CommMonitor (e.g. plain DDP recipes) there is no breakdown: only the wall clock
    # per epoch, set-up included, and no communication columns
    breakdown = any(r["epoch_breakdown"] for r in runs.values())

    def seconds(record: dict) -> float:
        return epoch_avg(record)["total"] if breakdown else record["wall_s"] / max(1, record["epochs"])

    def comm_columns(record: dict) -> list[float]:
        if not breakdown:
            return []
        avg = epoch_avg(record)
        return [*(avg[k] for k in TIME_CATEGORIES), link_bytes(record, "inter") / 1e6, link_bytes(record, "intra") / 1e6]

    base = seconds(runs[baseline])
    rows = [[name, record["mode"] or "-", seconds(record), *comm_columns(record),
             *(record["metrics"].get(m, float("nan")) for m in metrics), f"{base / max(seconds(record), 1e-12):.2f}x"]
            for name, record in runs.items()]
    comm_headers = ("compute s", "intra comm s", "inter comm s", "grad sync s", "inter MB/epoch", "intra MB/epoch")
    headers = ("run", "mode", "epoch s" if breakdown else "wall s/epoch", *(comm_headers if breakdown else ()),
               *(m.replace("_", " ") for m in metrics), f"speed-up vs {baseline}")
    return markdown_table(headers, rows)


_WARNING_LINE = re.compile(r"([\w./\\-]+\.py:\d+: .*)")  # "path.py:line: message", maybe after a progress bar
#: what the strategies report about a run (their rank-zero info lines) and the plots it saved
_REPORT_LINE = re.compile(r"^(granndis: mode|AHD|Pipe-BD|Optimus-CC|Visual Genome|plot: )")


def compare(configs: list[str], extra: list[str], root: str = "runs/compare") -> dict[str, dict]:
    """Runs ``granndis fit --config C`` for every config (in turn, as separate launches), then
    prints their summaries side by side. Each run's whole output goes to ``ROOT/NAME/log.txt``;
    the screen shows its warnings (each once), its fit summary and, if it fails, its last lines."""
    import subprocess

    runs = {}
    for config in configs:
        name = Path(config).stem
        out = Path(root) / name
        out.mkdir(parents=True, exist_ok=True)
        log = out / "log.txt"
        cmd = [sys.executable, "-m", "lightning_granndis.cli", "fit", "--config", config,
               f"--trainer.default_root_dir={out}", *extra]
        print(f"\n=== {name}: {' '.join(cmd[2:])}\n    (whole output: {log})", flush=True)
        with open(log, "w") as f:
            code = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
        lines = log.read_text(errors="replace").splitlines()
        if code != 0:
            print("\n".join(lines[-40:]), flush=True)
            raise SystemExit(f"granndis compare: {name} failed (exit {code}); its whole output is in {log}.")
        print(run_digest(lines), flush=True)
        runs[name] = json.loads((out / "summary.json").read_text())
    table = compare_table(runs)
    links = next((r["links"] for r in runs.values() if r.get("links")), "")
    print(f"\n== comparison (seconds per rank per epoch; links: {links}) ==\n{table}\n", flush=True)
    Path(root).mkdir(parents=True, exist_ok=True)
    (Path(root) / "comparison.md").write_text(table + "\n")
    return runs


def run_digest(lines: list[str]) -> str:
    """A run's output in brief: its distinct warnings (first line of each, once), what the
    strategy reported (its choices, schedules, saved plots) and the fit summary block."""
    warned = list(dict.fromkeys(m.group(1).strip()[:200] for m in map(_WARNING_LINE.search, lines) if m))
    reported = list(dict.fromkeys(line.strip() for line in lines if _REPORT_LINE.match(line) and "%|" not in line))
    start = next((i for i, line in enumerate(lines) if line.startswith("== fit summary")), len(lines))
    summary = [line for line in lines[start:] if line.strip() and "wandb" not in line]
    text = [f"warnings ({len(warned)}, each once):", *(f"  {w}" for w in warned)] if warned else []
    return "\n".join(text + reported + summary)


def partition_main(argv: list[str]) -> int:
    """``granndis partition``: the offline partitioning step (see ``graph/store``)."""
    import argparse
    import shlex

    from lightning_granndis.datamodules.dataset_partition import partition_dataset
    from lightning_granndis.graph.store.shards import MODES

    parser = argparse.ArgumentParser(prog="granndis partition", description=(
        "Partition a graph once into a graph store: one shard per server with exactly what it trains on, "
        "and a manifest. Train from it with OGBNodeDataModule(NAME, store=OUT) or GraphStoreDataModule(OUT)."))
    parser.add_argument("--dataset", required=True, help="an OGBNodeDataModule name (ogbn-*, synthetic-*)")
    parser.add_argument("--root", default="data", help="data root (default: data)")
    parser.add_argument("--out", required=True, help="store directory")
    parser.add_argument("--servers", type=int, required=True)
    parser.add_argument("--devices", type=int, required=True, help="devices (ranks) per server")
    parser.add_argument("--mode", required=True, choices=MODES,
                        help="GraNNDis mode, or full (gnn_fb_base) / minibatch (gnn_mb_base)")
    parser.add_argument("--hops", type=int, default=3, help="the model's message-passing layers (default 3)")
    parser.add_argument("--fanout", type=_fanout_arg, default=None,
                        help="EAS external fan-out: one int, or one per expansion hop as 15,10 (default 15); "
                             "the sampled modes (cob, minibatch) read their fan-outs at run time")
    parser.add_argument("--eas-hops", type=int, default=1)
    parser.add_argument("--eas-sampling", default="degree", choices=["degree", "uniform"])
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--iterations", type=int, default=None)
    parser.add_argument("--resample", default="once", choices=["once", "epoch"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-dir", default=None,
                        help="where METIS assignments are cached, shared by a graph's stores (default ROOT/metis-cache)")
    args = parser.parse_args(argv)
    manifest = partition_dataset(
        args.dataset, args.out, args.mode, args.servers, args.devices, args.hops, root=args.root, seed=args.seed,
        command="granndis partition " + " ".join(shlex.quote(a) for a in argv), fanout=args.fanout,
        eas_hops=args.eas_hops, eas_sampling=args.eas_sampling, batch_size=args.batch_size,
        iterations=args.iterations, resample=args.resample,
        cache_dir=args.cache_dir or str(Path(args.root) / "metis-cache"))
    total = sum(e["bytes"] for e in manifest["shards"]) + (manifest["structure"] or {}).get("bytes", 0)
    print(f"granndis partition: {args.dataset} -> {args.out}: {len(manifest['shards'])} server shards, "
          f"{total / 2**20:.1f} MiB in all, {manifest['partition_seconds']:.1f}s, peak RSS "
          f"{manifest['partition_peak_rss_mb']:.0f} MB", flush=True)
    return 0


def _fanout_arg(text: str):
    """``--fanout 15`` or ``--fanout 15,10,5`` (PyG's num_neighbors)."""
    values = [int(v) for v in text.split(",")]
    return values[0] if len(values) == 1 else values


def main(argv: list[str] | None = None) -> int:
    given = argv
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "partition":
        return partition_main(argv[1:])
    if argv and argv[0] == "compare":
        configs = [a for a in argv[1:] if not a.startswith("--")]
        extra = [a for a in argv[1:] if a.startswith("--")]
        if not configs:
            print("usage: granndis compare CONFIG.yaml [CONFIG.yaml ...] [--trainer.max_epochs=N ...]", file=sys.stderr)
            return 2
        compare(configs, extra)
        return 0
    run(given)  # None: LightningCLI reads sys.argv itself
    return 0


if __name__ == "__main__":
    main()
