"""Under torchrun (2 ranks): Recall@K summed over ranks.

1. The metrics themselves: ``random_images(n)`` split round-robin over the ranks, each rank updating
   its share; every rank writes ``compute()``.
2. The model end to end: ``trainer.validate`` under Lightning DDP with the weights in
   ``weights.pt`` on the scenes under ``root``; rank 0 writes the logged metrics.

Usage: vrd_recall.py OUT ROOT
"""

import json
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch

sys.path.insert(0, str(Path(__file__).parent.parent))
from vrd_recall_cases import random_images, update_all  # noqa: E402

from lightning_granndis import comm  # noqa: E402
from lightning_granndis.datamodules import VisualGenomeDataModule  # noqa: E402
from lightning_granndis.models.vrd import VisualRelationshipModel  # noqa: E402

out, root = Path(sys.argv[1]), sys.argv[2]
torch.set_num_threads(1)
config = json.loads((out / "config.json").read_text())

dm = VisualGenomeDataModule(root=root, images_per_batch=2)
model = VisualRelationshipModel(variant="LS+SVW", width_mult=0.25, num_objects=config["num_objects"],
                                num_predicates=config["num_predicates"])
model.load_state_dict(torch.load(out / "weights.pt", weights_only=True))
trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=False, enable_progress_bar=False,
                     enable_model_summary=False)
logged = trainer.validate(model, dm, verbose=False)[0]
rank, world = comm.get_rank(), comm.get_world_size()

metrics = update_all(random_images(12), rank, world)  # torchmetrics syncs over the default group in compute()
computed = {f"{name}/{k}": float(v) for name, m in metrics.items() for k, v in m.compute().items()}
(out / f"rank{rank}.json").write_text(json.dumps({"computed": computed, "logged": logged}))

comm.barrier()
comm.destroy()
