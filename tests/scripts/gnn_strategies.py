"""Under torchrun (4 ranks = 2 virtual servers x 2 devices): GNN strategies on the tiny synthetic
graph. For each configuration, saves per rank: the first step's returned loss, owned-seed logits
with their global ids, the synced gradients, the parameters after ``steps`` steps, the ledger and
the exact test accuracy.

usage: gnn_strategies.py OUT DATA_ROOT STEPS NAME[,NAME...]   (NAME = strategy:conv[:epochs[:seed]])
"""

import hashlib
import json
import os
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import BasePredictionWriter, Callback

import lightning_granndis  # noqa: F401
from lightning_granndis import comm as _comm_module
from lightning_granndis.callbacks import CommMonitor
from lightning_granndis.datamodules.ogb import OGBNodeDataModule
from lightning_granndis.models.gnn import GNNNodeClassifier
from lightning_granndis.strategies import FullGraphBaselineStrategy, MiniBatchBaselineStrategy, ServerAwareGNNStrategy

out, root, steps = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
names = sys.argv[4].split(",")


class Capture(Callback):
    """Records the first training step: loss, logits of owned seeds, synced gradients."""

    def __init__(self):
        self.record, self._handle = {}, None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step != 0:
            return
        graph = trainer.strategy._graphs[int(batch.granndis_key)]
        ids = graph.n_id[: graph.n_owned][graph.seed]
        self.record["ids"] = ids.tolist()

        def keep(module, args, output):
            self.record["logits"] = output[graph.seed].detach().tolist()
            self._handle.remove()

        self._handle = pl_module.head.register_forward_hook(keep)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == 1:
            self.record["loss"] = float(outputs["loss"])
            self.record["logged_loss"] = float(trainer.callback_metrics["train_loss"])

    def on_after_backward(self, trainer, pl_module):
        if trainer.global_step == 0 and "grads" not in self.record:
            self.record["grads"] = {k: p.grad.detach().clone().tolist() for k, p in pl_module.named_parameters()}


class SaveOnRankZero(BasePredictionWriter):
    """What a user's writer does: every vertex's prediction, once."""

    def __init__(self, path):
        super().__init__(write_interval="epoch")
        self.path = path

    def write_on_epoch_end(self, trainer, pl_module, predictions, batch_indices):
        if trainer.is_global_zero:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            torch.save(torch.cat(predictions), self.path)


SCATTERS = [0]  # how often this rank took part in handing out plans (a store needs none)
_scatter = _comm_module.scatter_objects


def _counting_scatter(*args, **kwargs):
    SCATTERS[0] += 1
    return _scatter(*args, **kwargs)


_comm_module.scatter_objects = _counting_scatter

for name in names:
    SCATTERS[0] = 0
    strategy_name, conv, *rest = name.split(":")
    epochs = int(rest[0]) if rest else None
    precision = "32-true"
    if strategy_name.endswith("_bf16"):  # the same run under mixed precision
        strategy_name, precision = strategy_name[: -len("_bf16")], "bf16-mixed"
    pl.seed_everything(int(rest[1]) if len(rest) > 1 else 0)
    store = None
    if strategy_name.startswith("st_"):  # the same strategy from a graph store (tests write it)
        strategy_name = strategy_name[3:]
        store_root = os.environ.get("GNN_STORE_ROOT", f"{root}/stores").format(node=os.environ.get("GROUP_RANK", "0"))
        store = f"{store_root}/{'full' if strategy_name.startswith('fb') else strategy_name.split('_')[0]}"
    dm = OGBNodeDataModule("synthetic-tiny", root=root, store=store)
    dm.prepare_data()
    dm.setup()
    model = GNNNodeClassifier(dm.num_features, dm.num_classes, conv=conv, hidden=16, dropout=0.0 if epochs is None else 0.5)
    common = dict(servers=2, link_model="10gbe", batch_size=128)
    strategy = {
        "flx": lambda: ServerAwareGNNStrategy(mode="flx", **common),
        "cob": lambda: ServerAwareGNNStrategy(mode="cob", fanout=5, **common),
        "eas": lambda: ServerAwareGNNStrategy(mode="eas", **common),
        "auto": lambda: ServerAwareGNNStrategy(mode="auto", **common),
        "eas_q4": lambda: ServerAwareGNNStrategy(mode="eas", halo_bits=4, **common),
        "flx_ei": lambda: ServerAwareGNNStrategy(mode="flx", sparse_aggregation=False, **common),
        "fb": lambda: FullGraphBaselineStrategy(servers=2, link_model="10gbe"),
        "fb_ei": lambda: FullGraphBaselineStrategy(servers=2, link_model="10gbe", sparse_aggregation=False),
        "fb_q8": lambda: FullGraphBaselineStrategy(servers=2, link_model="10gbe", halo_bits=8),
        "mb": lambda: MiniBatchBaselineStrategy(servers=2, link_model="10gbe", batch_size=128),
    }[strategy_name]()
    capture = Capture()
    monitor = CommMonitor(dirpath=str(out / name.replace(":", "_")))
    limits = dict(max_epochs=epochs) if epochs else dict(max_steps=steps)
    local = int(os.environ["LOCAL_WORLD_SIZE"])
    trainer = pl.Trainer(accelerator="cpu", devices=local, num_nodes=int(os.environ["WORLD_SIZE"]) // local,
                         strategy=strategy, logger=False, precision=precision,
                         callbacks=[capture, monitor, SaveOnRankZero(out / name.replace(":", "_") / "written.pt")],
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, check_val_every_n_epoch=1000, **limits)
    trainer.fit(model, datamodule=dm)
    ledger = strategy.comm.ledger.to_dict()  # test() sets up a fresh communicator
    trainer.test(model, datamodule=dm, verbose=False)
    rank = trainer.global_rank
    record = dict(capture.record)
    # a user's predict: a default Trainer's predict on the same datamodule (and a prediction writer)
    predictions = trainer.predict(model, datamodule=dm)
    pred = torch.cat(predictions)
    record["pred_sha"] = hashlib.sha1(pred.float().numpy().tobytes()).hexdigest()
    if rank == 0:
        record["pred"] = pred.float().tolist()
    shard = next(iter(strategy._shards.values()))
    record.update(store=store, scatters=SCATTERS[0], server=shard.server,
                  held_rows=sum(int(p.x.shape[0]) for p in shard.train) + int(shard.eval.x.shape[0]),
                  train_ids=sorted({int(i) for p in shard.train for i in p.graph.n_id}))
    record.update(
        params={k: v.detach().tolist() for k, v in model.state_dict().items()},
        ledger=ledger, test_acc=strategy.last_eval.get("test"),
        mode=strategy.resolved_mode, reason=strategy.choice.reason if strategy.choice else None,
        steps=trainer.global_step, epochs=monitor.epochs, time_png=(monitor.summary or {}).get("time_png"), iterations=int(trainer.num_training_batches),
    )
    (out / name.replace(":", "_")).mkdir(parents=True, exist_ok=True)
    (out / name.replace(":", "_") / f"rank{rank}.json").write_text(json.dumps(record))

# Leave the process group cleanly: a rank torn down at interpreter exit can abort (seen on busy CI).
from lightning_granndis import comm as _comm  # noqa: E402

_comm.barrier()
_comm.destroy()
