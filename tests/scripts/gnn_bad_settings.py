"""Under torchrun (4 ranks = 2 virtual servers x 2 devices): sampled-mode settings that cannot
work for the model; each rank records the error it raised (or that it trained) and how many
training steps ran before it.

usage: gnn_bad_settings.py OUT DATA_ROOT
"""

import json
import sys
from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

import lightning_granndis  # noqa: F401
from lightning_granndis import comm
from lightning_granndis.datamodules.ogb import OGBNodeDataModule
from lightning_granndis.models.gnn import GNNNodeClassifier
from lightning_granndis.strategies import MiniBatchBaselineStrategy, ServerAwareGNNStrategy

out, root = Path(sys.argv[1]), sys.argv[2]
CASES = {  # the model has 3 message-passing layers
    "mb_fanout_length": lambda: MiniBatchBaselineStrategy(servers=2, fanout=[15, 10], batch_size=64),
    "cob_fanout_length": lambda: ServerAwareGNNStrategy(servers=2, mode="cob", fanout=[15, 10, 5, 5]),
    "eas_fanout_length": lambda: ServerAwareGNNStrategy(servers=2, mode="eas", eas_fanout=[15, 10]),
    "mb_drop_last_empty": lambda: MiniBatchBaselineStrategy(servers=2, batch_size=4096, drop_last=True),
    "cob_over_budget": lambda: ServerAwareGNNStrategy(servers=2, mode="cob", memory_budget_mb=50),
    "mb_over_budget": lambda: MiniBatchBaselineStrategy(servers=2, memory_budget_mb=50),
}


class Steps(Callback):
    def __init__(self):
        self.steps = 0

    def on_train_batch_start(self, *args):
        self.steps += 1


rank = None
for name, make in CASES.items():
    dm = OGBNodeDataModule("synthetic-tiny", root=root)
    dm.setup()
    steps = Steps()
    trainer = pl.Trainer(accelerator="cpu", devices=4, strategy=make(), max_epochs=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, callbacks=[steps])
    rank = trainer.global_rank
    try:
        trainer.fit(GNNNodeClassifier(dm.num_features, dm.num_classes, hidden=8), datamodule=dm)
        error = None
    except Exception as caught:  # noqa: BLE001 - recorded for the test
        error = f"{type(caught).__name__}: {caught}"
    (out / f"{name}.rank{rank}.json").write_text(json.dumps({"error": error, "steps": steps.steps}))

comm.barrier()
comm.destroy()
