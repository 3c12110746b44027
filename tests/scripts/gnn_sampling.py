"""Under torchrun (4 ranks = 2 virtual servers x 2 devices): per-epoch sampling (CoB, MB_base,
EAS with resample='epoch') on the tiny synthetic graph. Per configuration and rank, saves what
each batch held (a digest of its global vertex ids) per epoch for two runs with the same seed, a
run resumed from the first epoch's checkpoint, the final parameters of each, and the producer's
high-water mark.

usage: gnn_sampling.py OUT DATA_ROOT NAME[,NAME...]
       (NAME = cob | cob_unshared | cob_trim | mb | mb_trim | eas_epoch; *_trim: trim_layers=True)
"""

import hashlib
import json
import sys
from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

import lightning_granndis  # noqa: F401
from lightning_granndis.datamodules.ogb import OGBNodeDataModule
from lightning_granndis.models.gnn import GNNNodeClassifier
from lightning_granndis.strategies import MiniBatchBaselineStrategy, ServerAwareGNNStrategy

out, root = Path(sys.argv[1]), sys.argv[2]
names = sys.argv[3].split(",")
EPOCHS, DEPTH, BATCH = 3, 2, 100


class Batches(Callback):
    """Digest of every batch's vertex ids, by epoch."""

    def __init__(self):
        self.epochs: dict[int, list[str]] = {}
        self.seeds: dict[int, list[int]] = {}
        self.trimmed_steps = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        key = int(batch.granndis_key)
        graph = trainer.strategy._graphs[key]
        digest = hashlib.sha1(graph.n_id.cpu().numpy().tobytes()).hexdigest()[:16]
        self.epochs.setdefault(trainer.current_epoch, []).append(digest)
        seeds = int(trainer.strategy._parts[key].masks["train_mask"].sum())
        self.seeds.setdefault(trainer.current_epoch, []).append(seeds)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.trimmed_steps += int(trainer.strategy._masking._trim)  # the step's graph was trimmed


def strategy_for(name):
    common = dict(servers=2, link_model="10gbe", batch_size=BATCH, sampler_depth=DEPTH)
    return {  # per-hop fan-outs, PyG's num_neighbors form, for the model's 3 layers
        "cob": lambda: ServerAwareGNNStrategy(mode="cob", fanout=[5, 4, 3], **common),
        "cob_unshared": lambda: ServerAwareGNNStrategy(mode="cob", fanout=[5, 4, 3], share_sampling=False, **common),
        "eas_epoch": lambda: ServerAwareGNNStrategy(mode="eas", resample="epoch", **common),
        "cob_trim": lambda: ServerAwareGNNStrategy(mode="cob", fanout=[5, 4, 3], trim_layers=True, **common),
        "mb": lambda: MiniBatchBaselineStrategy(fanout=[5, 4, -1], **common),
        "mb_trim": lambda: MiniBatchBaselineStrategy(fanout=[5, 4, -1], trim_layers=True, **common),
    }[name]()


def fit(name, ckpt_dir=None, resume=None):
    pl.seed_everything(0)
    dm = OGBNodeDataModule("synthetic-tiny", root=root)
    dm.setup()  # the model's input width
    model = GNNNodeClassifier(dm.num_features, dm.num_classes, conv="sage", hidden=16, dropout=0.0)
    batches = Batches()
    callbacks = [batches]
    if ckpt_dir:
        callbacks.append(ModelCheckpoint(dirpath=ckpt_dir, filename="{epoch}", save_top_k=-1, every_n_epochs=1,
                                         save_on_train_epoch_end=True))
    strategy = strategy_for(name)
    trainer = pl.Trainer(accelerator="cpu", devices=4, strategy=strategy, max_epochs=EPOCHS, logger=False,
                         callbacks=callbacks, enable_checkpointing=bool(ckpt_dir), enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, check_val_every_n_epoch=1000)
    trainer.fit(model, datamodule=dm, ckpt_path=resume)
    return trainer, {
        "batches": {str(k): v for k, v in batches.epochs.items()},
        "params": {k: v.detach().tolist() for k, v in model.state_dict().items()},
        "producer_stopped": strategy._sampled.producer is None,  # teardown stopped the sampling thread
        "high_water": strategy._sampled.high_water, "depth": DEPTH, "most_held": strategy._sampled.most_held,
        "sampling_bytes": strategy.comm.ledger.get("intra", "sampling").bytes,
        "seeds": {str(k): v for k, v in batches.seeds.items()}, "batch_size": BATCH,
        "iterations": int(trainer.num_training_batches), "layers_trimmed": strategy.layers_trimmed,
        "trimmed_steps": batches.trimmed_steps,
    }


for name in names:
    ckpts = out / name / "ckpt"
    trainer, first = fit(name, ckpt_dir=str(ckpts))
    _, again = fit(name)
    _, resumed = fit(name, resume=str(ckpts / "epoch=0.ckpt"))
    record = {"first": first, "again": again, "resumed": resumed}
    (out / name / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))

# Leave the process group cleanly: a rank torn down at interpreter exit can abort ("terminate
# called without an active exception", seen once in the suite).
from lightning_granndis import comm  # noqa: E402

comm.barrier()
comm.destroy()
