"""Pipe-BD beside its baselines: the same teacher, student and data, 4 processes.

The teacher (torchvision MobileNetV2 for small images) is first trained on the embedded digits,
then cut into 6 blocks and distilled block by block into a narrower student with each strategy:

- DNA: every block data-parallel on every rank; each block re-runs the teacher from the input;
- LS: a stage per rank (6 blocks over 4 ranks, split evenly); each rank re-runs the teacher from
  the input up to its last block;
- TR: teacher relaying over the same stages, all ranks meeting at a barrier before each step;
- TR+DPU: the same, each rank stepping as soon as its backward ends;
- TR+DPU+AHD: the stage split and data-parallel widths chosen by profiling (``schedule="auto"``).

Columns: seconds per epoch (mean over the epochs after the first; the slowest rank), teacher
block executions per batch (the most on any rank, and the total over ranks), peak memory per rank
(the process's peak resident set on CPU, the largest over ranks; and the largest activation memory
of a step), the accuracy of the assembled student on the test split. Teacher-guided per-block
maths is the same in every row, so accuracy differs only through BatchNorm's per-rank batch
statistics.

    python benchmarks/pipe_bd.py [--epochs 4] [--batch 128]

Writes benchmarks/results/pipe_bd.{json,md,png}: rows keyed by name with epoch_s,
teacher_block_execs, peak_mem_mb, student_acc; settings under "meta".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _results import save_results  # noqa: E402

from lightning_granndis.report import markdown_table  # noqa: E402

WORKER = Path(__file__).parent / "pipe_bd_worker.py"
ROWS = {
    "DNA": {"mode": "dna"},
    "LS": {"mode": "ls", "schedule": "even"},
    "TR": {"mode": "tr", "schedule": "even", "dpu": False},
    "TR+DPU": {"mode": "tr", "schedule": "even", "dpu": True},
    "TR+DPU+AHD": {"mode": "tr", "schedule": "auto", "dpu": True},
}


def train_teacher(path: Path, args) -> float:
    import lightning.pytorch as pl

    from lightning_granndis.datamodules import ImageDataModule
    from lightning_granndis.models import ImageClassifier

    pl.seed_everything(0, verbose=False)
    data = ImageDataModule(image_size=args.image_size, batch_size=64)
    model = ImageClassifier(width_mult=args.width_mult, image_size=args.image_size, export_path=str(path))
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=args.teacher_epochs, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, data)
    return float(trainer.test(model, data, verbose=False)[0]["test_acc"])


def summarise(ranks: list[dict]) -> dict:
    epochs = [sum(r["epochs_s"][1:]) / max(1, len(r["epochs_s"]) - 1) for r in ranks]
    execs = ranks[0]["report"]["teacher_execs_per_batch"]
    out = {"epoch_s": max(epochs), "teacher_block_execs": max(execs), "teacher_block_execs_total": sum(execs),
           "peak_mem_mb": max(r["peak_mem_mb"] for r in ranks), "activation_mb": max(r["activation_mb"] for r in ranks),
           "student_acc": ranks[0]["student_acc"], "schedule": ranks[0]["report"]["schedule"],
           "measured_step_s": ranks[0]["report"]["measured_step_s"]}
    if "predicted_step_s" in ranks[0]["report"]:
        out["predicted_step_s"] = ranks[0]["report"]["predicted_step_s"]
    return out


def describe(schedule: dict) -> str:
    return " ".join(f"{s}x{w}" if w > 1 else f"{s}" for s, w in zip(schedule["stages"], schedule["widths"]))


def table(rows: dict[str, dict]) -> str:
    base = rows["DNA"]
    return markdown_table(
        ("row", "schedule", "epoch s", "speed-up vs DNA", "teacher block runs / batch (max rank, total)",
         "peak mem MB (x DNA)", "activation MB", "student test acc"),
        [[name, describe(r["schedule"]), r["epoch_s"], f"{base['epoch_s'] / r['epoch_s']:.2f}x",
          f"{r['teacher_block_execs']:g}, {r['teacher_block_execs_total']:g}",
          f"{r['peak_mem_mb']:.0f} ({r['peak_mem_mb'] / base['peak_mem_mb']:.2f}x)", r["activation_mb"],
          r["student_acc"]] for name, r in rows.items()])


def plot(rows: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(rows)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, key, label in zip(axes, ("epoch_s", "teacher_block_execs_total", "student_acc"),
                              ("seconds per epoch", "teacher block runs per batch (all ranks)", "student test accuracy")):
        ax.bar(names, [rows[n][key] for n in names], color=["#999999", "#bbbbbb", "#6baed6", "#3182bd", "#08519c"])
        ax.set_title(label)
        ax.tick_params(axis="x", rotation=20)
    fig.suptitle("Pipe-BD beside DNA and LS (4 processes, 6 blocks)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--width-mult", type=float, default=1.0)
    parser.add_argument("--image-size", type=int, default=16)
    parser.add_argument("--teacher-epochs", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.01)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        teacher = Path(tmp) / "teacher.pt"
        t0 = time.perf_counter()
        teacher_acc = train_teacher(teacher, args)
        print(f"teacher: test accuracy {teacher_acc:.3f} after {time.perf_counter() - t0:.0f} s", flush=True)
        settings = {"teacher": str(teacher), "width_mult": args.width_mult, "image_size": args.image_size,
                    "batch": args.batch, "epochs": args.epochs, "lr": args.lr, "nproc": 4}
        rows = [{"name": name, "strategy": strategy} for name, strategy in ROWS.items()]
        out = Path(tmp) / "out"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4", str(WORKER),
               str(out), json.dumps(settings), json.dumps(rows)]
        subprocess.run(cmd, check=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
        results = {name: summarise([json.loads((out / f"{name}_rank{r}.json").read_text()) for r in range(4)])
                   for name in ROWS}
        ahd_line = json.loads((out / "TR+DPU+AHD_rank0.json").read_text())["ahd"]
    auto = results["TR+DPU+AHD"]
    text = (f"# Pipe-BD beside DNA and LS\n\n4 processes on this machine; teacher MobileNetV2 (width "
            f"{args.width_mult}) for {args.image_size}x{args.image_size} digits, test accuracy {teacher_acc:.3f}; 6 "
            f"blocks; batch {args.batch}; {args.epochs} epochs.\n\n{table(results)}\n\n{ahd_line}; measured "
            f"{auto['measured_step_s'] * 1e3:.1f} ms/step.\n\nTargets: TR+DPU+AHD {results['DNA']['epoch_s'] / auto['epoch_s']:.2f}x "
            f"faster than DNA per epoch (>= 2x); peak memory {auto['peak_mem_mb'] / results['DNA']['peak_mem_mb']:.2f}x "
            f"DNA's (<= 1.25x); student accuracy {auto['student_acc']:.3f} vs DNA's {results['DNA']['student_acc']:.3f}.\n")
    data = {**results, "meta": {**vars(args), "teacher_test_acc": teacher_acc, "nproc": 4, "blocks": 6,
                                "ahd": ahd_line, "machine": f"{os.cpu_count()} cores, CPU, gloo"}}
    save_results("pipe_bd", data, text, lambda p: plot(results, p))


if __name__ == "__main__":
    main()
