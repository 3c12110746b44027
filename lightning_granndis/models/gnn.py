"""A node classifier around unmodified PyG message-passing layers."""

from __future__ import annotations

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn

CONVS = ("sage", "gcn", "gat", "graph", "gin")


def make_conv(kind: str, in_channels: int, out_channels: int) -> nn.Module:
    from torch_geometric import nn as gnn

    if kind == "sage":
        return gnn.SAGEConv(in_channels, out_channels)
    if kind == "gcn":
        return gnn.GCNConv(in_channels, out_channels)
    if kind == "gat":
        return gnn.GATConv(in_channels, out_channels, heads=1)
    if kind == "graph":
        return gnn.GraphConv(in_channels, out_channels)
    if kind == "gin":  # GIN's MLP: two linear layers (Xu et al., ICLR'19)
        return gnn.GINConv(nn.Sequential(nn.Linear(in_channels, out_channels), nn.ReLU(),
                                         nn.Linear(out_channels, out_channels)))
    raise ValueError(f"Unknown conv {kind!r}; choose one of {', '.join(CONVS)}.")


class GNNNodeClassifier(pl.LightningModule):
    """``L`` message-passing layers (ReLU, dropout between them) and a linear head, trained with
    cross-entropy on ``batch.train_mask`` — the GraNNDis papers' GraphSAGE (3 layers, hidden 64)
    by default.

    Args:
        in_channels: feature width.
        num_classes: classes.
        conv: ``sage`` (default), ``gcn``, ``gat``, ``graph`` or ``gin``.
        hidden: hidden width (default 64).
        num_layers: message-passing layers (default 3).
        dropout: dropout (default 0.5).
        lr: Adam's learning rate (default 0.01).

    Shapes: ``x`` [N, in_channels], ``edge_index`` [2, E] → logits [N, num_classes].
    """

    def __init__(self, in_channels: int, num_classes: int, conv: str = "sage", hidden: int = 64,
                 num_layers: int = 3, dropout: float = 0.5, lr: float = 0.01) -> None:
        super().__init__()
        self.save_hyperparameters()
        widths = [in_channels] + [hidden] * num_layers
        self.convs = nn.ModuleList(make_conv(conv, a, b) for a, b in zip(widths[:-1], widths[1:]))
        self.head = nn.Linear(hidden, num_classes)
        self.dropout = dropout

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        for conv in self.convs:
            x = F.dropout(F.relu(conv(x, edge_index)), self.dropout, self.training)
        return self.head(x)

    def training_step(self, batch, batch_idx):
        logits = self(batch.x, batch.edge_index)
        loss = F.cross_entropy(logits[batch.train_mask], batch.y[batch.train_mask])
        self.log("train_loss", loss, prog_bar=True, batch_size=1)
        return loss

    def _accuracy(self, batch, split: str) -> torch.Tensor:
        mask = getattr(batch, f"{split}_mask")
        pred = self(batch.x, batch.edge_index).argmax(-1)
        return (pred[mask] == batch.y[mask]).float().mean()

    def validation_step(self, batch, batch_idx):
        self.log("val_acc", self._accuracy(batch, "val"), prog_bar=True, batch_size=1)

    def test_step(self, batch, batch_idx):
        self.log("test_acc", self._accuracy(batch, "test"), batch_size=1)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
