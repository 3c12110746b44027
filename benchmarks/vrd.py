"""The VRD model's ablation on the embedded scenes: predicate detection for every variant.

Each variant (L, LS, V, SV, SVW, LS+SVW) trains the same number of epochs on the same generated
scenes (Visual Genome layout, 7 predicates, 40 colour+shape object classes), then is tested:
Recall@50 with one predicate per pair (k=1) and with all (k=all), and zero-shot Recall@50 on test
triplets never seen in training.

    python benchmarks/vrd.py [--epochs 10] [--images 600]

Writes benchmarks/results/vrd.{json,md,png}: rows keyed by variant with R@50_k1, R@50_kall,
zs_R@50_k1, zs_R@50_kall, R@100_k1, train_s; settings and split sizes under "meta". Target (the
paper's ablation): LS+SVW above L, V and SVW alone.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _results import save_results  # noqa: E402

import lightning.pytorch as pl  # noqa: E402

from lightning_granndis.datamodules import VisualGenomeDataModule  # noqa: E402
from lightning_granndis.models.vrd import VARIANTS, VisualRelationshipModel  # noqa: E402
from lightning_granndis.report import markdown_table  # noqa: E402


def run(variant: str, root: str, args) -> dict:
    pl.seed_everything(0, verbose=False)
    dm = VisualGenomeDataModule(root=root, batch_size=32, crop_size=32)
    model = VisualRelationshipModel(variant=variant, lr=args.lr)  # sizes from the DataModule
    trainer = pl.Trainer(max_epochs=args.epochs, accelerator="cpu", devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0)
    t0 = time.perf_counter()
    trainer.fit(model, dm)
    train_s = time.perf_counter() - t0
    out = trainer.test(model, dm, verbose=False)[0]
    row = {"R@50_k1": out["test_R@50_k1"], "R@50_kall": out["test_R@50_kall"],
           "zs_R@50_k1": out.get("test_zs_R@50_k1", float("nan")),
           "zs_R@50_kall": out.get("test_zs_R@50_kall", float("nan")), "R@100_k1": out["test_R@100_k1"],
           "train_s": train_s}
    print(variant, {k: round(v, 4) for k, v in row.items()}, flush=True)
    return row


def plot(rows: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(rows)
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.38
    xs = range(len(names))
    ax.bar([x - width / 2 for x in xs], [rows[n]["R@50_k1"] for n in names], width, label="R@50, k=1")
    ax.bar([x + width / 2 for x in xs], [rows[n]["zs_R@50_k1"] for n in names], width, label="zero-shot R@50, k=1")
    ax.set_xticks(list(xs), names)
    ax.set_ylim(0, 1)
    ax.legend()
    ax.set_title("VRD ablation on the embedded scenes (predicate detection)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--images", type=int, default=600)
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    with tempfile.TemporaryDirectory() as tmp:
        from lightning_granndis.vrd.scenes import write_scenes

        root = str(write_scenes(Path(tmp) / "scenes", args.images, seed=0))
        dm = VisualGenomeDataModule(root=root)
        dm.setup()
        split = {k: len(v) for k, v in dm.splits.items()}
        test = dm.splits["test"]
        split["test_zero_shot"] = sum(r.triplet in test.zero_shot for r in test.rels)
        split["objects"], split["predicates"] = dm.num_object_classes, dm.num_predicate_classes
        print("relationships:", split, flush=True)
        rows = {v: run(v, root, args) for v in VARIANTS}
    best = rows["LS+SVW"]["R@50_k1"]
    beaten = [v for v in ("L", "V", "SVW") if rows[v]["R@50_k1"] >= best]
    text = (f"# VRD ablation (predicate detection)\n\n{args.images} generated scenes ({split['objects']} object classes, "
            f"{split['predicates']} predicates; relationships: {split['train']} train, {split['val']} val, {split['test']} "
            f"test of which {split['test_zero_shot']} zero-shot), {args.epochs} epochs per variant, one process.\n\n"
            + markdown_table(
                ("variant", "R@50 k=1", "R@50 k=all", "zero-shot R@50 k=1", "zero-shot R@50 k=all", "R@100 k=1",
                 "train s"),
                [[v, r["R@50_k1"], r["R@50_kall"], r["zs_R@50_k1"], r["zs_R@50_kall"], r["R@100_k1"], r["train_s"]]
                 for v, r in rows.items()])
            + f"\n\nTarget: LS+SVW above L, V and SVW on R@50 k=1: "
            + ("met" if not beaten else f"not met ({', '.join(beaten)} at or above)") + ".\n")
    save_results("vrd", {**rows, "meta": {**vars(args), "relationships": split}}, text, lambda p: plot(rows, p))


if __name__ == "__main__":
    main()
