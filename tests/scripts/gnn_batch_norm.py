"""OGB's own ogbn-arxiv example model (GCNConv + BatchNorm1d + ReLU + dropout, log-softmax) under a
GNN strategy on the tiny graph, 4 ranks: rank 0 saves the logged loss per step, the state dict
(weights and BatchNorm running statistics) after the steps, and the predictions.

    torchrun --nproc-per-node=4 tests/scripts/gnn_batch_norm.py OUT DATA_ROOT STEPS STRATEGY[,STRATEGY]
"""

import json
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback
from torch_geometric.nn import GCNConv

import lightning_granndis  # noqa: F401
from lightning_granndis.datamodules.ogb import OGBNodeDataModule
from lightning_granndis.strategies import FullGraphBaselineStrategy, ServerAwareGNNStrategy

torch.set_num_threads(1)


class ArxivGCN(pl.LightningModule):
    """ogb/examples/nodeproppred/arxiv/gnn.py's GCN, as a user writes it."""

    def __init__(self, in_channels, hidden, out_channels, num_layers=3, dropout=0.0, lr=0.01, optimizer="adam"):
        super().__init__()
        self.convs = torch.nn.ModuleList([GCNConv(in_channels, hidden, cached=False)])
        self.bns = torch.nn.ModuleList([torch.nn.BatchNorm1d(hidden)])
        for _ in range(num_layers - 2):
            self.convs.append(GCNConv(hidden, hidden))
            self.bns.append(torch.nn.BatchNorm1d(hidden))
        self.convs.append(GCNConv(hidden, out_channels))
        self.dropout, self.lr, self.optimizer = dropout, lr, optimizer

    def forward(self, x, edge_index):
        for conv, bn in zip(self.convs[:-1], self.bns):
            x = F.dropout(F.relu(bn(conv(x, edge_index))), p=self.dropout, training=self.training)
        return self.convs[-1](x, edge_index).log_softmax(dim=-1)

    def training_step(self, batch, batch_idx):
        out = self(batch.x, batch.edge_index)
        loss = F.nll_loss(out[batch.train_mask], batch.y.view(-1)[batch.train_mask])
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        # OGB's example uses Adam; the exactness test uses SGD: a bias just before a BatchNorm has a
        # zero gradient up to rounding, which Adam's normalisation turns into steps of lr
        if self.optimizer == "sgd":
            return torch.optim.SGD(self.parameters(), lr=0.5)
        return torch.optim.Adam(self.parameters(), lr=self.lr)


class Losses(Callback):
    def __init__(self):
        self.logged = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.logged.append(float(trainer.callback_metrics["train_loss"]))


if __name__ == "__main__":
    out, root, steps = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    for name in sys.argv[4].split(","):
        pl.seed_everything(0)
        dm = OGBNodeDataModule("synthetic-tiny", root=root)
        dm.setup()
        model = ArxivGCN(dm.num_features, 16, dm.num_classes, optimizer="sgd")
        losses = Losses()
        strategy = {"flx": lambda: ServerAwareGNNStrategy(mode="flx", servers=2, link_model="10gbe"),
                    "cob": lambda: ServerAwareGNNStrategy(mode="cob", servers=2, link_model="10gbe", batch_size=128,
                                                          fanout=5),
                    "fb": lambda: FullGraphBaselineStrategy(servers=2, link_model="10gbe")}[name]()
        trainer = pl.Trainer(accelerator="cpu", devices=4, strategy=strategy, max_steps=steps, logger=False,
                             callbacks=[losses], enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, num_sanity_val_steps=0, check_val_every_n_epoch=1000)
        trainer.fit(model, datamodule=dm)
        pred = torch.cat(trainer.predict(model, datamodule=dm))
        if trainer.is_global_zero:
            torch.save({"logged": losses.logged, "state": model.state_dict(), "pred": pred}, out / f"{name}.pt")
    from lightning_granndis import comm

    comm.barrier()
    comm.destroy()
